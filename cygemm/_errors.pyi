class CygemmError(RuntimeError): ...
class CudaError(CygemmError):
    status: int
    call: str
    name: str
    def __init__(self, status: int, call: str) -> None: ...
class CudaDriverError(CygemmError):
    status: int
    call: str
    name: str
    def __init__(self, status: int, call: str) -> None: ...
class CublasError(CygemmError):
    status: int
    call: str
    name: str
    def __init__(self, status: int, call: str) -> None: ...
class CaptureError(CygemmError): ...
