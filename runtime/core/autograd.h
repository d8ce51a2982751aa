/* Reverse-mode autograd. Ops that see an input requiring grad (and grad mode on) record a node on
 * their output; the node keeps edges to its inputs' nodes (or to leaf tensors), the tensors its
 * backward needs (detached), and small attributes. zr_backward walks the reachable nodes in
 * reverse creation order (the tape order), so a module's span of nodes is contiguous in seq.
 *
 * Writing an op (see ops/elementwise.c for the pattern):
 *   zr_tensor *out = ...compute...;
 *   zr_node *n;
 *   if (zr_autograd_record(out, "mul", mul_backward, 2, (zr_tensor *[]){a, b}, &n)) goto fail;
 *   if (n) { zr_node_save(n, a); zr_node_save(n, b); }
 * and a backward that writes new references to grad_in[i] for each input with
 * zr_node_needs_grad(n, i) (leaving the others NULL). */
#ifndef ZR_AUTOGRAD_H
#define ZR_AUTOGRAD_H

#include "core/tensor.h"

#define ZR_NODE_MAX_SAVED 12

typedef zr_status (*zr_backward_fn)(zr_node *n, zr_tensor *grad_out, zr_tensor **grad_in);

typedef struct {
    zr_node *fn;      /* producer of the input (retained), or NULL */
    zr_tensor *leaf;  /* the input itself when it is a leaf that requires grad (retained) */
    zr_dtype dtype;   /* input metadata, so backward need not keep the input alive */
    int ndim;
    int64_t shape[ZR_MAX_DIMS];
} zr_edge;

struct zr_node {
    int refcount;
    uint64_t seq; /* creation order; backward runs in decreasing seq */
    const char *name;
    zr_backward_fn backward;
    int n_inputs;
    zr_edge *edges;
    int n_saved;
    zr_tensor *saved[ZR_NODE_MAX_SAVED];
    double f[4];     /* op attributes (scalars) */
    int64_t i[8];    /* op attributes (dims, flags) */
    void *ctx;       /* op-specific state, freed with ctx_free */
    void (*ctx_free)(void *ctx);
    zr_dtype out_dtype;
    int out_ndim;
    int64_t out_shape[ZR_MAX_DIMS];
    zr_device out_device;
    /* engine bookkeeping */
    zr_tensor *grad_accum;
    uint64_t visit;
    const void *grad_owner; /* see zr_node_input_grad_buffer; NULL when none */
    zr_status (*grad_finish)(const void *owner, zr_tensor *buf); /* the owner's, or NULL */
};

/* Grad mode (per thread). zr_set_grad_enabled returns the previous value. */
int zr_grad_enabled(void);
int zr_set_grad_enabled(int on);
/* The gradient the next backward is expected to seed its loss with (per thread; default 1, what
 * loss:backward() uses; the ZeRO engine sets 1/gradient_accumulation_steps times the loss scale
 * before each forward). A speed hint only, never a semantics: cross_entropy with inplace makes
 * its input gradient for this seed during the forward, and its backward rescales it when the
 * gradient that arrives differs. Finite and non-zero (the setter's caller checks). */
double zr_loss_grad_hint(void);
double zr_set_loss_grad_hint(double g); /* returns the previous hint */
/* True if t carries history or is a leaf with requires_grad. */
static inline int zr_tensor_needs_grad(const zr_tensor *t) { return t->requires_grad || t->grad_fn; }

/* Records a node for out when grad mode is on and any input needs grad; *node is set to it (owned
 * by out) or to NULL when nothing is recorded. Inputs may contain NULL (absent optional input). */
zr_status zr_autograd_record(zr_tensor *out, const char *name, zr_backward_fn fn, int n_inputs,
                             zr_tensor *const *inputs, zr_node **node);
/* Same, but records even when no input needs grad (grad mode still must be on): for nodes whose
 * backward reaches parameters the inputs do not show, like zr.checkpoint. */
zr_status zr_autograd_record_always(zr_tensor *out, const char *name, zr_backward_fn fn,
                                    int n_inputs, zr_tensor *const *inputs, zr_node **node);
/* Keeps a detached reference to t for backward. */
zr_status zr_node_save(zr_node *n, zr_tensor *t);
static inline int zr_node_needs_grad(const zr_node *n, int i) {
    return n->edges[i].fn || n->edges[i].leaf;
}
/* The existing gradient of input i when it is a leaf whose .grad a backward may add into directly
 * (contiguous, the leaf's shape; any float dtype); NULL otherwise. A backward that adds its result
 * there leaves grad_in[i] NULL; the leaf still counts as done (its hook fires as usual). */
zr_tensor *zr_node_leaf_grad(zr_node *n, int i);
/* For ops whose outputs are disjoint views of one input (zr_split_sizes): the pending gradient
 * of input i's producer, to write into in place instead of returning a full-size gradient per
 * view. Sets *buf (borrowed: the producer's grad_accum, contiguous, input i's shape and dtype)
 * and *state:
 *   ZR_GRADBUF_NEW     created now, uninitialized: every element must be written, by the
 *                      caller now or by finish (may be NULL) once the owner's mark ends;
 *                      owner is recorded on the producer
 *   ZR_GRADBUF_OWNED   created earlier for this owner and written by nobody else since
 *                      (regions owner has not written still hold what owner put there)
 *   ZR_GRADBUF_SHARED  holds other gradients too: add into it (it was made exclusive first,
 *                      copied if anything else could see it)
 * The engine ends the owner mark by calling finish(owner, buf) whenever it adds a gradient there
 * itself, another owner asks for the buffer, or the producer's backward is about to read it (buf
 * NULL when the buffer was dropped unread: only release what the mark holds). *buf is NULL (state NEW) when input i has no producer node (a leaf, or no gradient wanted). */
enum { ZR_GRADBUF_NEW, ZR_GRADBUF_OWNED, ZR_GRADBUF_SHARED };
zr_status zr_node_input_grad_buffer(zr_node *n, int i, const void *owner,
                                    zr_status (*finish)(const void *owner, zr_tensor *buf), zr_tensor **buf,
                                    int *state);
void zr_node_retain(zr_node *n);
void zr_node_release(zr_node *n);

/* Backpropagates from root. grad may be NULL when root has one element (then 1 is used).
 * Leaves accumulate into ->grad and fire their hook once their gradient is complete.
 * The graph's saved tensors are freed afterwards unless retain_graph. */
zr_status zr_backward(zr_tensor *root, zr_tensor *grad, int retain_graph);

/* Backward profiling: when on (1), the time of every node's backward is measured (CUDA events on
 * GPUs, synchronised per op; the wall clock on the CPU) and summed by op name; the report lists
 * them, largest first. 2: the host's time to issue each op, wall clock, nothing synchronised (on a
 * GPU an op whose host time is far above its issue cost waits for the device: a hidden sync). */
void zr_autograd_profile(int on);
/* Memory timeline on stderr: a line per forward op / backward node (also ZRUN_MEM_TRACE=1). */
void zr_autograd_mem_trace(int on);
/* Writes "op  calls  total ms  share" lines into buf and resets the counters. */
void zr_autograd_profile_report(char *buf, size_t len);
/* While profiling: charges the time since the previous forward op (or mark) to an entry `name` of
 * its own, so host work between ops (the engine's garbage collection) is not charged to the op
 * that follows it. A no-op when profiling is off. */
void zr_autograd_profile_mark(const char *name, zr_device dev);

/* Leaf gradient hook (ZeRO engine); ctx is freed with ctx_free when replaced or the leaf dies. */
void zr_tensor_set_grad_hook(zr_tensor *t, zr_grad_hook hook, void *ctx, void (*ctx_free)(void *));

/* Adds g into the leaf's gradient (allocating it, category grads, dtype of the leaf). With no
 * gradient yet, g itself becomes it when nobody else holds g (refcount 1, its storage too) and it
 * matches the leaf (dtype, shape, device, contiguous, exactly its storage): no copy. */
zr_status zr_accumulate_leaf_grad(zr_tensor *leaf, zr_tensor *g);

/* Reduces a broadcast gradient back to the input's shape by summing the expanded dims. */
zr_tensor *zr_sum_to_shape(zr_tensor *g, int ndim, const int64_t *shape);

#endif
