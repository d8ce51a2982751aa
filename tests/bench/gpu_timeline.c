// GPU timeline recorder (GPU machine; there is no nsys there). Loaded with LD_PRELOAD into any CUDA
// program, it records through CUPTI every kernel, copy and memset on the device and every CUDA
// runtime/driver API call on the host, and writes them at exit as one CSV for
// tests/bench/timeline_gaps.lua, which says how much of a window the GPU was idle and why.
//   make build/bench/libgpu_timeline.so
//   GPU_TIMELINE_OUT=t.csv LD_PRELOAD=build/bench/libgpu_timeline.so ./zrun tests/bench/bench_llama.lua ...
//   ./zrun tests/bench/timeline_gaps.lua t.csv       (where the GPU idles, and why)
//   ./zrun tests/bench/timeline_kernels.lua t.csv    (one step's kernel time by group)
// Rows (times in ns from the recorder's start): K,start,end,stream,correlation,name (kernels); M,start,end,stream,correlation,bytes (copies
// and memsets); A,start,end,thread,correlation,name (API calls; runtime and driver both, so a runtime call
// and the driver calls it makes appear nested).
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BUF_BYTES (8u << 20)

static FILE *out;
static uint64_t t0; // timestamps are written from here, so they fit a double exactly

static void check(CUptiResult r, const char *what) {
  if (r == CUPTI_SUCCESS) return;
  const char *s = "?";
  cuptiGetResultString(r, &s);
  fprintf(stderr, "gpu_timeline: %s failed: %s\n", what, s);
  exit(1);
}

static void CUPTIAPI buffer_requested(uint8_t **buf, size_t *size, size_t *max_records) {
  *buf = aligned_alloc(8, BUF_BYTES);
  *size = *buf ? BUF_BYTES : 0;
  *max_records = 0;
}

static const char *api_name(CUpti_CallbackDomain domain, CUpti_CallbackId cbid) {
  const char *name = NULL;
  if (cuptiGetCallbackName(domain, cbid, &name) != CUPTI_SUCCESS || !name) return "?";
  return name;
}

static void write_record(const CUpti_Activity *rec) {
  switch (rec->kind) {
  case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
  case CUPTI_ACTIVITY_KIND_KERNEL: {
    const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
    fprintf(out, "K,%llu,%llu,%u,%u,%s\n", (unsigned long long)(k->start - t0), (unsigned long long)(k->end - t0),
            k->streamId, k->correlationId, k->name ? k->name : "?");
    break;
  }
  case CUPTI_ACTIVITY_KIND_MEMCPY: {
    const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)rec;
    fprintf(out, "M,%llu,%llu,%u,%u,%llu\n", (unsigned long long)(m->start - t0), (unsigned long long)(m->end - t0),
            m->streamId, m->correlationId, (unsigned long long)m->bytes);
    break;
  }
  case CUPTI_ACTIVITY_KIND_MEMSET: {
    const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)rec;
    fprintf(out, "M,%llu,%llu,%u,%u,%llu\n", (unsigned long long)(m->start - t0), (unsigned long long)(m->end - t0),
            m->streamId, m->correlationId, (unsigned long long)m->bytes);
    break;
  }
  case CUPTI_ACTIVITY_KIND_RUNTIME:
  case CUPTI_ACTIVITY_KIND_DRIVER: {
    const CUpti_ActivityAPI *a = (const CUpti_ActivityAPI *)rec;
    CUpti_CallbackDomain d =
        rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME ? CUPTI_CB_DOMAIN_RUNTIME_API : CUPTI_CB_DOMAIN_DRIVER_API;
    fprintf(out, "A,%llu,%llu,%u,%u,%s\n", (unsigned long long)(a->start - t0), (unsigned long long)(a->end - t0),
            a->threadId, a->correlationId, api_name(d, a->cbid));
    break;
  }
  default:
    break;
  }
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid) {
  CUpti_Activity *rec = NULL;
  while (cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) write_record(rec);
  size_t dropped = 0;
  if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS && dropped)
    fprintf(stderr, "gpu_timeline: %zu records dropped\n", dropped);
  free(buf);
}

__attribute__((constructor)) static void timeline_start(void) {
  const char *path = getenv("GPU_TIMELINE_OUT");
  if (!path || !*path) path = "gpu_timeline.csv";
  out = fopen(path, "w");
  if (!out) {
    fprintf(stderr, "gpu_timeline: cannot write %s\n", path);
    exit(1);
  }
  check(cuptiGetTimestamp(&t0), "cuptiGetTimestamp");
  check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enable kernels");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "enable copies");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET), "enable memsets");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME), "enable runtime API");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER), "enable driver API");
}

__attribute__((destructor)) static void timeline_stop(void) {
  if (!out) return;
  cuptiActivityFlushAll(1);
  fclose(out);
  out = NULL;
}
