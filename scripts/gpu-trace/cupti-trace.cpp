// A CUPTI activity tracer loaded by the CUDA driver through CUDA_INJECTION64_PATH (nsys is not
// usable on the lent machines): every kernel (graph-launched ones included, with their graph id),
// memcpy, memset and runtime-API call, with GPU/host timestamps, one tab-separated line each, to
// $TRACE_OUT. Built on the device: nvcc -shared (see run-profile.sh). KREC/MREC/SREC name the
// newest CUpti_ActivityKernelN / MemcpyN / MemsetN of the CUPTI headers there.
#include <cupti.h>
#include <cxxabi.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
static FILE *g_out;
static std::mutex g_mu;
#define CK(x) do { CUptiResult r_ = (x); if (r_ != CUPTI_SUCCESS) { const char *s_; cuptiGetResultString(r_, &s_); fprintf(stderr, "cupti-trace: %s: %s\n", #x, s_); } } while (0)
static void CUPTIAPI buf_req(uint8_t **buf, size_t *size, size_t *max) {
  *size = 16 << 20;
  *buf = (uint8_t *)aligned_alloc(8, *size);
  *max = 0;
}
static void CUPTIAPI buf_done(CUcontext, uint32_t, uint8_t *buf, size_t, size_t valid) {
  std::lock_guard<std::mutex> lk(g_mu);
  CUpti_Activity *rec = nullptr;
  while (cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) {
    switch (rec->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        auto *k = (KREC *)rec;
        int st = 0;
        char *d = abi::__cxa_demangle(k->name, nullptr, nullptr, &st);
        fprintf(g_out, "K\t%llu\t%llu\t%u\t%u\t%u\t%d,%d,%d\t%d,%d,%d\t%s\n", (unsigned long long)k->start,
                (unsigned long long)k->end, k->streamId, k->graphId, k->correlationId, k->gridX, k->gridY,
                k->gridZ, k->blockX, k->blockY, k->blockZ, st == 0 && d ? d : k->name);
        free(d);
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        auto *m = (MREC *)rec;
        fprintf(g_out, "M\t%llu\t%llu\t%u\t%u\t%u\t%llu\t%u\n", (unsigned long long)m->start,
                (unsigned long long)m->end, m->streamId, m->graphId, m->correlationId,
                (unsigned long long)m->bytes, (unsigned)m->copyKind);
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        auto *m = (SREC *)rec;
        fprintf(g_out, "S\t%llu\t%llu\t%u\t%u\t%u\t%llu\n", (unsigned long long)m->start,
                (unsigned long long)m->end, m->streamId, m->graphId, m->correlationId,
                (unsigned long long)m->bytes);
        break;
      }
      case CUPTI_ACTIVITY_KIND_RUNTIME: {
        auto *a = (CUpti_ActivityAPI *)rec;
        const char *n = "?";
        cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &n);
        fprintf(g_out, "R\t%llu\t%llu\t%u\t%u\t%u\t%s\n", (unsigned long long)a->start,
                (unsigned long long)a->end, a->threadId, a->correlationId, a->returnValue, n);
        break;
      }
      default:
        break;
    }
  }
  size_t dropped = 0;
  cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped);
  if (dropped) fprintf(g_out, "D\t%zu\n", dropped);
  free(buf);
}
static void at_exit() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_out) fflush(g_out);
}
extern "C" int InitializeInjection(void) {
  const char *p = getenv("TRACE_OUT");
  g_out = fopen(p ? p : "/tmp/cupti-trace.tsv", "w");
  if (!g_out) return 0;
  setvbuf(g_out, nullptr, _IOFBF, 1 << 22);
  CK(cuptiActivityRegisterCallbacks(buf_req, buf_done));
  CK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  CK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY));
  CK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET));
  CK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME));
  atexit(at_exit);
  fprintf(stderr, "cupti-trace: on, writing %s\n", p ? p : "/tmp/cupti-trace.tsv");
  return 1;
}
