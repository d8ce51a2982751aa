/* The backward engine (see autograd.h). */
#include "core/autograd.h"

#include <stdlib.h>
#include <string.h>

#include "ops/elementwise.h"
#include "ops/reduce.h"
#ifdef ZR_HAVE_CUDA
#include "cuda/device.h"
#endif
#include <stdio.h>
#include <time.h>

static _Thread_local int grad_on = 1;
static int prof_on; /* backward (and forward) profiling, see zr_autograd_profile */
static uint64_t next_seq = 1, next_visit = 1;

int zr_grad_enabled(void) { return grad_on; }
int zr_set_grad_enabled(int on) {
    int old = grad_on;
    grad_on = on;
    return old;
}

static _Thread_local double loss_grad_hint = 1.0;
double zr_loss_grad_hint(void) { return loss_grad_hint; }
double zr_set_loss_grad_hint(double g) {
    double old = loss_grad_hint;
    loss_grad_hint = g;
    return old;
}

void zr_node_retain(zr_node *n) {
    if (n) n->refcount++;
}

static zr_status end_owner(zr_node *p);

static void node_clear(zr_node *n) {
    for (int i = 0; i < n->n_saved; i++) zr_tensor_release(n->saved[i]);
    n->n_saved = 0;
    for (int i = 0; i < n->n_inputs; i++) {
        zr_node_release(n->edges[i].fn);
        zr_tensor_release(n->edges[i].leaf);
        n->edges[i].fn = NULL;
        n->edges[i].leaf = NULL;
    }
    if (n->ctx_free) n->ctx_free(n->ctx);
    n->ctx = NULL;
    n->ctx_free = NULL;
    zr_tensor_release(n->grad_accum);
    n->grad_accum = NULL;
    (void)end_owner(n); /* no buffer left to complete: only the mark's reference goes */
}

void zr_node_release(zr_node *n) {
    if (!n || --n->refcount > 0) return;
    node_clear(n);
    free(n->edges);
    free(n);
}

static void prof_forward(const char *name, zr_device dev);

/* ZRUN_MEM_TRACE=1: one stderr line per recorded forward op and per backward node with the
 * device's activations (current after the op, peak inside it) and total, in MiB — the timeline
 * that zr.memory.plan's simulation is checked against. */
static int mem_trace = -1;
void zr_autograd_mem_trace(int on) { mem_trace = on; }
static void trace_mem(const char *phase, const char *name, zr_device dev) {
    if (mem_trace < 0) {
        const char *e = getenv("ZRUN_MEM_TRACE");
        mem_trace = e && *e && strcmp(e, "0") != 0;
    }
    if (!mem_trace) return;
    zr_mem_stats s;
    zr_mem_get_stats(dev, &s);
    const double M = 1024.0 * 1024.0;
    fprintf(stderr, "[memtrace] %s %-18s act %10.2f peak %10.2f params %10.4f grads %10.2f ws %8.2f total %10.2f MiB\n",
            phase, name, s.current[ZR_MEM_ACTIVATIONS] / M, s.window_peak[ZR_MEM_ACTIVATIONS] / M,
            s.current[ZR_MEM_PARAMS] / M, s.current[ZR_MEM_GRADS] / M, s.window_peak[ZR_MEM_WORKSPACE] / M,
            s.total_current / M);
    zr_mem_window_reset(dev);
}

static zr_status record(zr_tensor *out, const char *name, zr_backward_fn fn, int n_inputs,
                        zr_tensor *const *inputs, zr_node **node, int force) {
    *node = NULL;
    if (prof_on && grad_on) prof_forward(name, out->storage->device);
    if (mem_trace) trace_mem(grad_on ? "fwd" : "nograd", name, out->storage->device);
    if (!grad_on) return ZR_OK;
    int any = force;
    for (int i = 0; i < n_inputs; i++)
        if (inputs[i] && zr_tensor_needs_grad(inputs[i])) any = 1;
    if (!any) return ZR_OK;
    zr_node *n = calloc(1, sizeof *n);
    zr_edge *e = calloc((size_t)(n_inputs ? n_inputs : 1), sizeof *e);
    if (!n || !e) {
        free(n);
        free(e);
        return zr_error("out of host memory recording %s for autograd", name);
    }
    n->refcount = 1;
    n->seq = __atomic_fetch_add(&next_seq, 1, __ATOMIC_RELAXED);
    n->name = name;
    n->backward = fn;
    n->n_inputs = n_inputs;
    n->edges = e;
    for (int i = 0; i < n_inputs; i++) {
        zr_tensor *t = inputs[i];
        if (!t) continue;
        e[i].dtype = t->dtype;
        e[i].ndim = t->ndim;
        memcpy(e[i].shape, t->shape, sizeof e[i].shape);
        if (t->grad_fn) {
            e[i].fn = t->grad_fn;
            zr_node_retain(t->grad_fn);
        } else if (t->requires_grad) e[i].leaf = zr_tensor_retain(t);
    }
    n->out_dtype = out->dtype;
    n->out_ndim = out->ndim;
    memcpy(n->out_shape, out->shape, sizeof n->out_shape);
    n->out_device = out->storage->device;
    zr_node_release(out->grad_fn);
    out->grad_fn = n;
    out->requires_grad = 1;
    *node = n;
    return ZR_OK;
}

zr_status zr_autograd_record(zr_tensor *out, const char *name, zr_backward_fn fn, int n_inputs,
                             zr_tensor *const *inputs, zr_node **node) {
    return record(out, name, fn, n_inputs, inputs, node, 0);
}
zr_status zr_autograd_record_always(zr_tensor *out, const char *name, zr_backward_fn fn,
                                    int n_inputs, zr_tensor *const *inputs, zr_node **node) {
    return record(out, name, fn, n_inputs, inputs, node, 1);
}

zr_status zr_node_save(zr_node *n, zr_tensor *t) {
    if (n->n_saved >= ZR_NODE_MAX_SAVED)
        return zr_error("%s: more than %d saved tensors", n->name, ZR_NODE_MAX_SAVED);
    /* A leaf parameter is kept itself, not a detached alias of its storage: ZeRO-3 swaps a
     * parameter's storage when it releases and re-gathers it, and backward must see the
     * re-gathered data (an alias would pin the released copy until backward). */
    zr_tensor *d = !t ? NULL : (t->requires_grad && !t->grad_fn) ? zr_tensor_retain(t) : zr_tensor_detach(t);
    if (t && !d) return ZR_ERR;
    n->saved[n->n_saved++] = d;
    return ZR_OK;
}

void zr_tensor_set_grad_hook(zr_tensor *t, zr_grad_hook hook, void *ctx, void (*ctx_free)(void *)) {
    if (t->hook_ctx_free) t->hook_ctx_free(t->hook_ctx);
    t->hook = hook;
    t->hook_ctx = ctx;
    t->hook_ctx_free = ctx_free;
}

/* Whether a fresh leaf gradient can simply be g itself (as PyTorch's AccumulateGrad steals it):
 * nothing else holds g or its storage (refcount 1 each: the caller's reference), it has the
 * leaf's dtype, shape and device, and it fills its own storage exactly. Saves a copy of every
 * gradient that arrives with no .grad to add into (ZeRO stages 2-3 over several ranks release
 * .grad once bucketed, so that is every parameter at every micro-batch). */
static int can_steal(const zr_tensor *leaf, const zr_tensor *g) {
    const zr_storage *s = g->storage;
    return g->refcount == 1 && s->refcount == 1 && !s->external && g->dtype == leaf->dtype &&
           !g->grad_fn && !g->requires_grad && g->offset == 0 && zr_tensor_is_contiguous(g) &&
           zr_tensor_same_shape(g, leaf) && zr_device_eq(s->device, leaf->storage->device) &&
           s->nbytes == (size_t)zr_tensor_numel(g) * zr_dtype_size(g->dtype);
}

zr_status zr_accumulate_leaf_grad(zr_tensor *leaf, zr_tensor *g) {
    if (!leaf->grad && can_steal(leaf, g)) {
        zr_storage_set_category(g->storage, ZR_MEM_GRADS);
        leaf->grad = zr_tensor_retain(g);
        return ZR_OK;
    }
    if (!leaf->grad) {
        zr_tensor *c = zr_tensor_new_cat(leaf->dtype, leaf->storage->device, leaf->ndim, leaf->shape,
                                         ZR_MEM_GRADS, 0);
        if (!c) return ZR_ERR;
        if (zr_tensor_copy_(c, g)) {
            zr_tensor_release(c);
            return ZR_ERR;
        }
        leaf->grad = c;
        return ZR_OK;
    }
    if (leaf->grad_stale) { /* the engine's zero_grad left it unfilled: overwrite */
        leaf->grad_stale = 0;
        return zr_tensor_copy_(leaf->grad, g);
    }
    return zr_add_(leaf->grad, g, 1.0);
}

/* Adds g into *slot (a node's pending output gradient). Takes ownership of g. */
static zr_status accumulate_node(zr_tensor **slot, zr_tensor *g) {
    if (!*slot) {
        *slot = g;
        return ZR_OK;
    }
    zr_tensor *s = zr_add(*slot, g);
    zr_tensor_release(g);
    if (!s) return ZR_ERR;
    zr_tensor_release(*slot);
    *slot = s;
    return ZR_OK;
}

zr_tensor *zr_node_leaf_grad(zr_node *n, int i) {
    zr_tensor *leaf = n->edges[i].leaf;
    if (!leaf || !leaf->grad) return NULL;
    zr_tensor *g = leaf->grad;
    if (!zr_tensor_is_contiguous(g) || !zr_tensor_same_shape(g, leaf) ||
        !zr_device_eq(g->storage->device, leaf->storage->device))
        return NULL;
    return g;
}

/* Ends p's owner mark on its pending gradient: the owner completes the buffer (when there still
 * is one) and drops the mark's reference. */
static zr_status end_owner(zr_node *p) {
    const void *owner = p->grad_owner;
    zr_status (*finish)(const void *, zr_tensor *) = p->grad_finish;
    p->grad_owner = NULL;
    p->grad_finish = NULL;
    return owner && finish ? finish(owner, p->grad_accum) : ZR_OK;
}

zr_status zr_node_input_grad_buffer(zr_node *n, int i, const void *owner,
                                    zr_status (*finish)(const void *owner, zr_tensor *buf), zr_tensor **buf,
                                    int *state) {
    zr_edge *e = &n->edges[i];
    zr_node *p = e->fn;
    *buf = NULL;
    *state = ZR_GRADBUF_NEW;
    if (!p) return ZR_OK;
    zr_tensor *cur = p->grad_accum;
    if (!cur) {
        cur = zr_tensor_new_cat(e->dtype, p->out_device, e->ndim, e->shape, ZR_MEM_ACTIVATIONS, 0);
        if (!cur) return ZR_ERR;
        p->grad_accum = cur;
        p->grad_owner = owner;
        p->grad_finish = finish;
        *buf = cur;
        return ZR_OK;
    }
    if (owner && p->grad_owner == owner) {
        *buf = cur;
        *state = ZR_GRADBUF_OWNED;
        return ZR_OK;
    }
    if (end_owner(p)) return ZR_ERR;
    /* Written in place only when nothing else can see it (no other reference, no other view of
     * its storage) and it has the plain layout; otherwise a private copy replaces it. */
    if (cur->refcount != 1 || cur->storage->refcount != 1 || !zr_tensor_is_contiguous(cur) ||
        cur->dtype != e->dtype || cur->ndim != e->ndim ||
        memcmp(cur->shape, e->shape, sizeof(int64_t) * (size_t)e->ndim) != 0) {
        zr_tensor *c = zr_tensor_new_cat(e->dtype, p->out_device, e->ndim, e->shape, ZR_MEM_ACTIVATIONS, 0);
        if (!c) return ZR_ERR;
        if (zr_tensor_copy_(c, cur)) {
            zr_tensor_release(c);
            return ZR_ERR;
        }
        zr_tensor_release(cur);
        p->grad_accum = cur = c;
    }
    *buf = cur;
    *state = ZR_GRADBUF_SHARED;
    return ZR_OK;
}

/* --- backward profiling --- */
typedef struct {
    const char *name;
    int64_t calls;
    double ms;
} prof_entry;
static prof_entry prof[128];
static int prof_n;

void zr_autograd_profile(int on) { prof_on = on; }

static void prof_add(const char *name, double ms) {
    int i;
    for (i = 0; i < prof_n; i++)
        if (prof[i].name == name || strcmp(prof[i].name, name) == 0) break;
    if (i == prof_n) {
        if (prof_n == 128) return;
        prof[prof_n++] = (prof_entry){name, 0, 0};
    }
    prof[i].calls++;
    prof[i].ms += ms;
}

static int cmp_prof(const void *a, const void *b) {
    double x = ((const prof_entry *)a)->ms, y = ((const prof_entry *)b)->ms;
    return x < y ? 1 : x > y ? -1 : 0;
}

void zr_autograd_profile_report(char *buf, size_t len) {
    double total = 0;
    for (int i = 0; i < prof_n; i++) total += prof[i].ms;
    qsort(prof, (size_t)prof_n, sizeof *prof, cmp_prof);
    size_t off = (size_t)snprintf(buf, len, "%-24s %8s %12s %7s\n", "op (fwd: forward)", "calls", "total ms", "share");
    for (int i = 0; i < prof_n && off < len; i++)
        off += (size_t)snprintf(buf + off, len - off, "%-24s %8lld %12.3f %6.1f%%\n", prof[i].name,
                                (long long)prof[i].calls, prof[i].ms, total > 0 ? 100 * prof[i].ms / total : 0);
    if (off < len) snprintf(buf + off, len - off, "%-24s %8s %12.3f\n", "total", "", total);
    prof_n = 0;
}

/* Forward: the time from the previous recorded op to this one is charged to this op ("fwd name"):
 * on a GPU, events on the compute stream with a synchronisation per op (so it includes launch
 * latency); the first op of a pass is charged from the last backward/report. */
static double fwd_last_ms;
#ifdef ZR_HAVE_CUDA
static cudaEvent_t fwd_last_ev;
#endif
static char fwd_names[64][48];
static int fwd_nnames;

/* The profile's entry name `prefix name`, kept for the report (the entry keeps the pointer). */
static const char *prof_label(const char *prefix, const char *name) {
    char want[sizeof fwd_names[0]];
    snprintf(want, sizeof want, "%s%s", prefix, name);
    for (int i = 0; i < fwd_nnames; i++)
        if (strcmp(fwd_names[i], want) == 0) return fwd_names[i];
    if (fwd_nnames == 64) return "fwd other";
    memcpy(fwd_names[fwd_nnames], want, sizeof want);
    return fwd_names[fwd_nnames++];
}

static double now_ms(void);
/* Charges the time since the previous mark (a forward op or zr_autograd_profile_mark) to entry. */
static void prof_charge(const char *entry, zr_device dev) {
#ifdef ZR_HAVE_CUDA
    if (dev.type == ZR_CUDA && prof_on == 1) {
        cudaEvent_t e = zr_cuda_event_new(1);
        zr_cuda_event_record(e, zr_cuda_stream(dev));
        zr_cuda_event_sync(e);
        if (fwd_last_ev) {
            prof_add(entry, zr_cuda_event_elapsed_ms(fwd_last_ev, e));
            zr_cuda_event_free(fwd_last_ev);
        }
        fwd_last_ev = e;
        return;
    }
#endif
    (void)dev;
    double t = now_ms();
    if (fwd_last_ms > 0) prof_add(entry, t - fwd_last_ms);
    fwd_last_ms = t;
}

static void prof_forward(const char *name, zr_device dev) { prof_charge(prof_label("fwd ", name), dev); }

void zr_autograd_profile_mark(const char *name, zr_device dev) {
    if (prof_on) prof_charge(prof_label("", name), dev);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static int cmp_seq_desc(const void *a, const void *b) {
    uint64_t x = (*(zr_node *const *)a)->seq, y = (*(zr_node *const *)b)->seq;
    return x < y ? 1 : x > y ? -1 : 0;
}

typedef struct {
    void **p;
    size_t n, cap;
} vec;
static int vec_push(vec *v, void *x) {
    if (v->n == v->cap) {
        size_t c = v->cap ? v->cap * 2 : 64;
        void **p = realloc(v->p, c * sizeof *p);
        if (!p) return zr_error("out of host memory in backward");
        v->p = p;
        v->cap = c;
    }
    v->p[v->n++] = x;
    return ZR_OK;
}

zr_status zr_backward(zr_tensor *root, zr_tensor *grad, int retain_graph) {
    char b1[128], b2[128];
    if (!zr_tensor_needs_grad(root))
        return zr_error("backward: the tensor does not require grad and has no grad_fn (was it "
                        "computed under no_grad, or from tensors without requires_grad?)");
    if (!grad && zr_tensor_numel(root) != 1)
        return zr_error("backward: grad can be implicit only for a tensor of one element, got "
                        "shape %s; pass a gradient", zr_tensor_shape_str(root, b1));
    if (grad && !zr_tensor_same_shape(grad, root))
        return zr_error("backward: gradient shape %s does not match tensor shape %s",
                        zr_tensor_shape_str(grad, b1), zr_tensor_shape_str(root, b2));
    zr_tensor *g0 = grad ? zr_tensor_retain(grad)
                         : zr_tensor_full(root->dtype, root->storage->device, root->ndim, root->shape, 1.0);
    if (!g0) return ZR_ERR;
    if (!root->grad_fn) { /* a leaf */
        zr_status st = zr_accumulate_leaf_grad(root, g0);
        zr_tensor_release(g0);
        if (!st && root->hook) root->hook(root, root->hook_ctx);
        return st;
    }
    int old_mode = zr_set_grad_enabled(0);
    zr_status st = ZR_OK;
    vec nodes = {0}, stack = {0}, leaves = {0};
    fwd_last_ms = 0; /* the next forward op is not charged with this backward */
#ifdef ZR_HAVE_CUDA
    if (fwd_last_ev) zr_cuda_event_free(fwd_last_ev);
    fwd_last_ev = NULL;
#endif
    uint64_t stamp = __atomic_fetch_add(&next_visit, 1, __ATOMIC_RELAXED);
    zr_node *top = root->grad_fn;
    top->visit = stamp;
    if ((st = vec_push(&stack, top))) goto done;
    while (stack.n) {
        zr_node *n = stack.p[--stack.n];
        if ((st = vec_push(&nodes, n))) goto done;
        for (int i = 0; i < n->n_inputs; i++) {
            zr_edge *e = &n->edges[i];
            if (e->leaf && (st = vec_push(&leaves, e->leaf))) goto done;
            if (e->fn && e->fn->visit != stamp) {
                e->fn->visit = stamp;
                if ((st = vec_push(&stack, e->fn))) goto done;
            }
        }
    }
    for (size_t i = 0; i < leaves.n; i++) ((zr_tensor *)leaves.p[i])->hook_pending = 0;
    for (size_t i = 0; i < leaves.n; i++) ((zr_tensor *)leaves.p[i])->hook_pending++;
    qsort(nodes.p, nodes.n, sizeof *nodes.p, cmp_seq_desc);
    for (size_t k = 0; k < nodes.n; k++) zr_node_retain(nodes.p[k]); /* survive edge clearing */
    top->grad_accum = g0;
    top->grad_owner = NULL;
    top->grad_finish = NULL;
    g0 = NULL;
    for (size_t k = 0; k < nodes.n && !st; k++) {
        zr_node *n = nodes.p[k];
        if (!n->backward) {
            st = zr_error("backward: the graph was already freed by an earlier backward (node %s); "
                          "pass retain_graph=true to backward twice", n->name);
            break;
        }
        st = end_owner(n); /* an owner's buffer is complete before anything reads it */
        if (st) break;
        zr_tensor *g = n->grad_accum;
        n->grad_accum = NULL;
        zr_tensor *gin_local[8];
        zr_tensor **gin = n->n_inputs <= 8 ? gin_local : calloc((size_t)n->n_inputs, sizeof *gin);
        if (!gin) {
            zr_tensor_release(g);
            st = zr_error("out of host memory in backward");
            break;
        }
        memset(gin, 0, (size_t)n->n_inputs * sizeof *gin);
        if (g) {
            double t0 = 0;
#ifdef ZR_HAVE_CUDA
            cudaEvent_t e0 = NULL, e1 = NULL;
            int on_gpu = prof_on == 1 && n->out_device.type == ZR_CUDA;
            if (on_gpu) {
                e0 = zr_cuda_event_new(1);
                e1 = zr_cuda_event_new(1);
                zr_cuda_event_record(e0, zr_cuda_stream(n->out_device));
            }
#endif
            if (prof_on) t0 = now_ms();
            st = n->backward(n, g, gin);
            if (st) zr_error_prefix("backward of %s: ", n->name);
#ifdef ZR_HAVE_CUDA
            if (on_gpu) {
                zr_cuda_event_record(e1, zr_cuda_stream(n->out_device));
                zr_cuda_event_sync(e1);
                prof_add(n->name, zr_cuda_event_elapsed_ms(e0, e1));
                zr_cuda_event_free(e0);
                zr_cuda_event_free(e1);
            } else
#endif
                if (prof_on)
                prof_add(n->name, now_ms() - t0);
        }
        for (int i = 0; i < n->n_inputs; i++) {
            zr_edge *e = &n->edges[i];
            zr_tensor *gi = gin[i];
            gin[i] = NULL;
            if (!st && gi && (gi->ndim != e->ndim || memcmp(gi->shape, e->shape, sizeof(int64_t) * (size_t)e->ndim))) {
                st = zr_error("internal: backward of %s gave a gradient of shape %s for input %d of "
                              "shape %s", n->name, zr_tensor_shape_str(gi, b1), i + 1,
                              zr_shape_str(e->ndim, e->shape, b2));
            }
            if (!st && gi && e->fn) {
                st = end_owner(e->fn); /* see zr_node_input_grad_buffer */
                if (!st) st = accumulate_node(&e->fn->grad_accum, gi);
                gi = NULL;
            } else if (!st && e->leaf) {
                if (gi) st = zr_accumulate_leaf_grad(e->leaf, gi);
                if (!st && --e->leaf->hook_pending == 0 && e->leaf->hook)
                    e->leaf->hook(e->leaf, e->leaf->hook_ctx);
            }
            zr_tensor_release(gi);
        }
        if (gin != gin_local) free(gin);
        zr_tensor_release(g);
        const char *nname = n->name;
        zr_device ndev = n->out_device;
        if (!retain_graph) {
            node_clear(n);
            n->backward = NULL;
        }
        if (mem_trace) trace_mem("bwd", nname, ndev);
    }
    for (size_t k = 0; k < nodes.n; k++) {
        zr_node *n = nodes.p[k];
        zr_tensor_release(n->grad_accum);
        n->grad_accum = NULL;
        (void)end_owner(n);
        zr_node_release(n);
    }
done:
    zr_tensor_release(g0);
    free(nodes.p);
    free(stack.p);
    free(leaves.p);
    zr_set_grad_enabled(old_mode);
    return st;
}

zr_tensor *zr_sum_to_shape(zr_tensor *g, int ndim, const int64_t *shape) {
    if (g->ndim == ndim && memcmp(g->shape, shape, sizeof(int64_t) * (size_t)ndim) == 0)
        return zr_tensor_retain(g);
    int lead = g->ndim - ndim;
    int dims[ZR_MAX_DIMS], nd = 0;
    for (int i = 0; i < g->ndim; i++)
        if (i < lead || (shape[i - lead] == 1 && g->shape[i] != 1)) dims[nd++] = i;
    zr_tensor *s = nd ? zr_sum(g, nd, dims, 1) : zr_tensor_retain(g);
    if (!s) return NULL;
    zr_tensor *r = zr_tensor_view_raw(s, ndim, shape);
    if (!r) { /* sum output is contiguous, so view cannot fail; keep the check anyway */
        zr_tensor_release(s);
        return NULL;
    }
    zr_tensor_release(s);
    return r;
}
