/* kiln's plugin ABI: custom operators from shared libraries.
 *
 * C only: nothing of C++ crosses this boundary, so a plugin may be built
 * with another compiler, standard library or language than kiln. Plugin
 * authors in C++ use the header-only wrapper kiln/plugin.hpp.
 *
 * A plugin library exports two symbols:
 *
 *   const uint32_t kiln_plugin_api_level;
 *       The API level the plugin NEEDS: the oldest kiln it works with.
 *       kiln refuses a plugin whose level is above its own, naming both.
 *   int kiln_plugin_register(const KilnPluginHost* host, char* error, size_t error_capacity);
 *       Called once when kiln loads the library: registers the plugin's ops
 *       through host->register_op. Returns 0, or nonzero with a message in
 *       `error` (NUL-terminated, at most error_capacity bytes with the NUL).
 *
 * Versioning caps instead of rejecting. Every struct starts with its own
 * size (struct_size = sizeof at the plugin's build). Later API levels only
 * append fields, so:
 *   - a plugin built against an older header loads in a newer kiln: kiln
 *     reads the fields the plugin's struct has and takes the documented
 *     default (0 / NULL) for the rest;
 *   - a plugin built against a newer header loads in an older kiln as long
 *     as its kiln_plugin_api_level (what it needs) is not above kiln's:
 *     kiln reads the fields it knows and ignores the tail. A plugin reads
 *     host->api_level before it uses anything newer than what it needs.
 * (onnxruntime's custom-op API rejected any op struct newer than the
 * runtime, which broke libraries built against newer headers that used
 * nothing new; see docs/plugins.md.)
 *
 * Errors: every callback that can fail returns 0 for success or nonzero
 * with a message in its `error` buffer; kiln turns it into an error naming
 * the plugin and the op. A callback must not let a C++ exception or a
 * longjmp cross into kiln (the C++ wrapper catches them).
 *
 * Threads: create, infer and workspace_bytes run while a model is compiled
 * or loaded; compute may run on several threads at once with the same
 * state (different calls' memory), so it must treat the state as read-only.
 * compute must not keep pointers to its tensors past the call.
 */
#ifndef KILN_PLUGIN_H_
#define KILN_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The API level of this header. Level 1: kernels with shape inference,
 * attributes as JSON, workspaces, and the in-place / elementwise /
 * stateless metadata. Level 2: the allocator hook (KilnOp.input_layout). */
#define KILN_PLUGIN_API_LEVEL 2

/* Most dimensions a tensor has (kiln's kMaxRank). */
#define KILN_PLUGIN_MAX_RANK 32

/* Element types: ONNX's TensorProto.DataType codes. */
enum {
  KILN_DTYPE_UNDEFINED = 0,
  KILN_DTYPE_FLOAT = 1,
  KILN_DTYPE_UINT8 = 2,
  KILN_DTYPE_INT8 = 3,
  KILN_DTYPE_UINT16 = 4,
  KILN_DTYPE_INT16 = 5,
  KILN_DTYPE_INT32 = 6,
  KILN_DTYPE_INT64 = 7,
  KILN_DTYPE_BOOL = 9,
  KILN_DTYPE_FLOAT16 = 10,
  KILN_DTYPE_DOUBLE = 11,
  KILN_DTYPE_UINT32 = 12,
  KILN_DTYPE_UINT64 = 13,
  KILN_DTYPE_BFLOAT16 = 16
};

/* A dimension not known when the model is compiled (shape inference of a
 * model with run-time shapes). */
#define KILN_DIM_UNKNOWN (-1)

/* A tensor's type for shape inference. An omitted optional input has dtype
 * KILN_DTYPE_UNDEFINED. */
typedef struct KilnTensorType {
  int32_t dtype;
  int32_t rank;
  int64_t dims[KILN_PLUGIN_MAX_RANK];
} KilnTensorType;

/* A dense, row-major tensor in memory while the op runs. An omitted
 * optional input has data == NULL. */
typedef struct KilnTensor {
  void* data;
  int32_t dtype;
  int32_t rank;
  const int64_t* dims;
} KilnTensor;

/* How an op wants one of its inputs laid out in memory (the allocator
 * hook, KilnOp.input_layout).
 *   alignment:     the input's data pointer is a multiple of it: a power of
 *                  two up to KILN_PLUGIN_MAX_ALIGNMENT; 0 or 1: no wish.
 *                  (Memory kiln plans is 64-byte aligned without asking.)
 *   padding_bytes: that many bytes after the input's last element may be
 *                  read (a vector loop's tail without a remainder loop);
 *                  their contents are unspecified and compute must not
 *                  write them. At most KILN_PLUGIN_MAX_PADDING. */
typedef struct KilnInputLayout {
  uint64_t alignment;
  uint64_t padding_bytes;
} KilnInputLayout;
#define KILN_PLUGIN_MAX_ALIGNMENT 4096
#define KILN_PLUGIN_MAX_PADDING (1u << 20)

/* One attribute of a node a composite op builds. `kind` says which member
 * holds the value; `count` is the length of a list. */
enum {
  KILN_ATTRIBUTE_INT = 1,
  KILN_ATTRIBUTE_FLOAT = 2,
  KILN_ATTRIBUTE_STRING = 3,
  KILN_ATTRIBUTE_INTS = 4,
  KILN_ATTRIBUTE_FLOATS = 5
};
typedef struct KilnAttribute {
  const char* name;
  int32_t kind;
  int32_t count;
  int64_t i;
  double f;
  const char* s;
  const int64_t* ints;
  const double* floats;
} KilnAttribute;

/* What a composite op's build() adds its body with. Values are ids: the
 * op's inputs are 0..input_count-1; every node and constant added gets the
 * next ones. */
typedef struct KilnGraphBuilder {
  uint32_t struct_size; /* sizeof(KilnGraphBuilder) in kiln's header */
  void* context;
  /* Adds a node of an operator kiln knows (`domain` "" for ONNX's, at the
   * model's opset) reading `inputs`; writes the ids of its `output_count`
   * outputs into `outputs`. */
  int (*add_node)(void* context, const char* domain, const char* op_type, const int32_t* inputs, int32_t input_count,
                  const KilnAttribute* attributes, int32_t attribute_count, int32_t* outputs, int32_t output_count,
                  char* error, size_t error_capacity);
  /* Adds a constant tensor of `type` (static) from `data` (its bytes, copied);
   * writes its id into `value`. */
  int (*add_constant)(void* context, const KilnTensorType* type, const void* data, int32_t* value, char* error,
                      size_t error_capacity);
} KilnGraphBuilder;

/* One operator. The fields up to `compute` are required (infer and compute
 * may be NULL for a composite op, which sets `build`); the ones after it
 * are optional (0 / NULL when absent), and a struct_size that stops before
 * any of them means the plugin's header did not have it: kiln takes the
 * default. */
typedef struct KilnOp {
  uint32_t struct_size; /* sizeof(KilnOp) in the plugin's header */
  const char* domain;   /* the ONNX node's domain, e.g. "com.example" (not ONNX's or kiln's own) */
  const char* name;     /* the ONNX node's op_type */
  int32_t since_version; /* first opset of `domain` this definition serves (>= 1) */
  int32_t until_version; /* last one; 0: no upper bound */
  int32_t min_inputs, max_inputs;
  int32_t min_outputs, max_outputs;

  /* The outputs' types from the inputs' types. kiln fills `outputs` with
   * KILN_DTYPE_UNDEFINED and rank -1 first; every output must get a dtype
   * and a rank (0..KILN_PLUGIN_MAX_RANK), and dimensions >= 0, or
   * KILN_DIM_UNKNOWN where an input's dimension is unknown. */
  int (*infer)(const void* state, const KilnTensorType* inputs, int32_t input_count, KilnTensorType* outputs,
               int32_t output_count, char* error, size_t error_capacity);
  /* Computes the outputs into the memory kiln gives (destination passing).
   * `workspace` is 64-byte aligned and workspace_bytes long (NULL and 0
   * without a workspace_bytes callback). */
  int (*compute)(const void* state, const KilnTensor* inputs, int32_t input_count, KilnTensor* outputs,
                 int32_t output_count, void* workspace, uint64_t workspace_bytes, char* error,
                 size_t error_capacity);

  /* Optional: builds the per-node state from the node's attributes, given
   * as one JSON object ({"axis": 1, "scale": 0.5, "mode": "x", "sizes":
   * [1, 2]}), once per node when a model is compiled or loaded, never per
   * call. Without it the state is op_data (below). */
  int (*create)(const char* attributes_json, void** state, char* error, size_t error_capacity);
  /* Optional: frees what create made. */
  void (*destroy)(void* state);
  /* Optional: bytes of scratch memory compute needs for these (static)
   * types; kiln plans it with the model's memory, so compute never
   * allocates. */
  uint64_t (*workspace_bytes)(const void* state, const KilnTensorType* inputs, int32_t input_count,
                              const KilnTensorType* outputs, int32_t output_count);

  /* Optional metadata (the reference's <op>_metadata). */
  uint32_t num_inplace;   /* outputs 0..num_inplace-1 are written over inputs
                             0..num_inplace-1 (same type and shape): compute
                             sees outputs[i].data == inputs[i].data, and kiln
                             keeps any other reader of such an input intact */
  int32_t is_elementwise; /* every output element depends only on the inputs'
                             elements at the same position (inputs and
                             outputs all of one shape): kiln may run it in
                             slices on several threads */
  int32_t is_stateless;   /* outputs depend only on inputs and attributes:
                             only then may kiln fold it on constants or merge
                             two equal nodes (ops are stateful by default) */

  /* Optional: the state of every node of the op when it has no `create`
   * (one function serving several ops, a host callback's closure). kiln
   * never frees it. */
  void* op_data;

  /* Optional, instead of infer and compute (which may then be NULL): a
   * composite op. kiln calls build once per node, before type inference,
   * and the node becomes the body it builds from operators kiln knows;
   * the compiler infers, fuses and plans through it like through the
   * model's own nodes, and the package needs no library at run time.
   * Writes the ids of the op's outputs into `outputs`. */
  int (*build)(const void* state, const KilnGraphBuilder* builder, const int32_t* inputs, int32_t input_count,
               int32_t* outputs, int32_t output_count, char* error, size_t error_capacity);

  /* Optional: the op that computes this one's gradients (the reference's
   * <op>_grad), in the same domain, and the reference's
   * separate_gradients: 0, one gradient op computes the partial
   * derivatives for every input; 1, it computes one, for the input index
   * given as its attribute input_grad_index. Declared and kept with the
   * op (training is not built yet). */
  const char* gradient_op;
  int32_t separate_gradients;

  /* Level 2. Optional: the allocator hook (the reference's <op>_allocator
   * with its allocating input indices): how input `input` (of types
   * `inputs`, static) should lie in memory. kiln calls it once per present
   * input when it compiles or loads a model, starting from a zeroed
   * `layout` (no wish); the inputs it leaves zeroed are the ones it does
   * not allocate. kiln plans such an input where the layout holds, or
   * copies it there first when it lies elsewhere (a model input, a
   * constant, a view at an unaligned offset): see docs/plugins.md. An op
   * with a layout wish is not run in elementwise slices. */
  int (*input_layout)(const void* state, int32_t input, const KilnTensorType* inputs, int32_t input_count,
                      KilnInputLayout* layout, char* error, size_t error_capacity);
} KilnOp;

/* The size of a KilnOp with the required fields only (a composite op
 * also needs `build`). */
#define KILN_OP_MIN_SIZE (offsetof(KilnOp, compute) + sizeof(void*))

/* What kiln hands kiln_plugin_register. */
typedef struct KilnPluginHost {
  uint32_t struct_size; /* sizeof(KilnPluginHost) in kiln's header */
  uint32_t api_level;   /* kiln's KILN_PLUGIN_API_LEVEL */
  void* context;
  /* Registers one op; kiln copies what it needs (the strings too), so the
   * struct may live on the stack. Returns 0, or nonzero with a message. */
  int (*register_op)(void* context, const KilnOp* op, char* error, size_t error_capacity);
} KilnPluginHost;

/* The symbols a plugin exports, by name. */
#define KILN_PLUGIN_LEVEL_SYMBOL "kiln_plugin_api_level"
#define KILN_PLUGIN_REGISTER_SYMBOL "kiln_plugin_register"
typedef int (*KilnPluginRegisterFunction)(const KilnPluginHost* host, char* error, size_t error_capacity);

#ifdef __cplusplus
}
#endif

#endif /* KILN_PLUGIN_H_ */
