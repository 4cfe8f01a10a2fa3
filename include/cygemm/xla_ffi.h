/* The part of XLA's FFI C API that cygemm's JAX handlers use, declared here so that cygemm
 * builds without jaxlib (as the CUDA runtime and cuBLAS are declared from their headers).
 *
 * XLA's FFI is a C ABI that XLA keeps stable within a major version: a handler is a C function
 * taking one call frame; every struct starts with its size and an extension chain, and XLA
 * reads no field past the size a caller gives. The layouts below follow that ABI for API
 * version 0.1 (the call frame, buffers, attributes, Error_Create and Stream_Get); a handler
 * reports the version it was built for when XLA asks (the metadata extension), and XLA checks
 * it. Only what cygemm reads or writes is named; the rest of the API table is padding of the
 * right size. */
#ifndef CYGEMM_XLA_FFI_H
#define CYGEMM_XLA_FFI_H
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CG_XLA_FFI_MAJOR 0
#define CG_XLA_FFI_MINOR 1

/* An extension in a struct's chain; type 1: the metadata XLA asks a handler for. */
typedef struct cg_xla_ext {
    size_t struct_size;
    int type;
    struct cg_xla_ext* next;
} cg_xla_ext;
enum { CG_XLA_EXT_METADATA = 1 };

typedef struct {
    size_t struct_size;
    cg_xla_ext* extension_start;
    int major;
    int minor;
} cg_xla_version;

typedef struct cg_xla_error cg_xla_error;           /* opaque: made by XLA's Error_Create */
typedef struct cg_xla_context cg_xla_context;       /* opaque: the execution context */

/* Error codes (absl's): those a handler returns. */
enum { CG_XLA_INVALID_ARGUMENT = 3, CG_XLA_FAILED_PRECONDITION = 9, CG_XLA_INTERNAL = 13 };

typedef struct {
    size_t struct_size;
    cg_xla_ext* extension_start;
    const char* message;
    int code;
} cg_xla_error_create_args;

typedef struct {
    size_t struct_size;
    cg_xla_ext* extension_start;
    cg_xla_context* ctx;
    void* stream;                                   /* out: the cudaStream_t XLA runs on */
} cg_xla_stream_get_args;

typedef cg_xla_error* (*cg_xla_error_create_fn)(cg_xla_error_create_args*);
typedef cg_xla_error* (*cg_xla_stream_get_fn)(cg_xla_stream_get_args*);

/* The API table: its header, then function pointers in XLA's order; cygemm calls the 1st
 * (Error_Create) and the 5th (Stream_Get). */
typedef struct {
    size_t struct_size;
    cg_xla_ext* extension_start;
    cg_xla_version version;
    const void* internal;
    cg_xla_error_create_fn error_create;
    void* error_get_message;
    void* error_destroy;
    void* handler_register;
    cg_xla_stream_get_fn stream_get;
} cg_xla_api;

/* An array argument or result: XLA's element type code, device pointer, rank and dims
 * (row-major unless the call's layouts say otherwise). */
typedef struct {
    size_t struct_size;
    cg_xla_ext* extension_start;
    int dtype;
    void* data;
    int64_t rank;
    int64_t* dims;
} cg_xla_buffer;

/* Attribute encodings: a string's bytes, a scalar (type code and pointer to its value). */
typedef struct { const char* ptr; size_t len; } cg_xla_bytes;
typedef struct { int dtype; void* value; } cg_xla_scalar;
enum { CG_XLA_ATTR_ARRAY = 1, CG_XLA_ATTR_DICT = 2, CG_XLA_ATTR_SCALAR = 3, CG_XLA_ATTR_STRING = 4 };
enum { CG_XLA_ARG_BUFFER = 1 };

typedef struct {
    size_t struct_size;
    cg_xla_ext* extension_start;
    int64_t size;
    int* types;                                     /* CG_XLA_ARG_BUFFER for every array */
    void** items;                                   /* cg_xla_buffer* each */
} cg_xla_list;

typedef struct {
    size_t struct_size;
    cg_xla_ext* extension_start;
    int64_t size;
    int* types;
    cg_xla_bytes** names;
    void** items;
} cg_xla_attrs;

enum { CG_XLA_STAGE_EXECUTE = 3 };

typedef struct {
    size_t struct_size;
    cg_xla_ext* extension_start;
    const cg_xla_api* api;
    cg_xla_context* ctx;
    int stage;
    cg_xla_list args;
    cg_xla_list rets;
    cg_xla_attrs attrs;
} cg_xla_call_frame;

/* What a handler says about itself when XLA asks (the metadata extension). traits: bit 0, its
 * calls launch the same device work every time and may be traced into XLA's command buffers
 * (CUDA graphs) and replayed. */
enum { CG_XLA_TRAIT_COMMAND_BUFFER = 1 };
typedef struct {
    size_t struct_size;
    cg_xla_version version;
    uint32_t traits;
} cg_xla_metadata;

typedef struct {
    cg_xla_ext base;
    cg_xla_metadata* metadata;
} cg_xla_metadata_ext;

typedef cg_xla_error* (*cg_xla_handler)(cg_xla_call_frame*);

#ifdef __cplusplus
}
#endif
#endif
