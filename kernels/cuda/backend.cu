// kernels/cuda/backend.cu: the cuda krn_backend table: memory, streams, cuBLAS handle, scratch and device count.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/add.cuh"
#include "kernels/cuda/attention_decode.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/get_rows.cuh"
#include "kernels/cuda/kv_store.cuh"
#include "kernels/cuda/matmul.cuh"
#include "kernels/cuda/moe.cuh"
#include "kernels/cuda/rmsnorm.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/softmax.cuh"
#include "kernels/cuda/swiglu.cuh"

krn_cuda_state *krn_cuda_st(krn_ctx *c) {
  if (!c || !c->dev) {
    fprintf(stderr, "krn cuda: op called on a ctx without ctx_init\n");
    return NULL;
  }
  krn_cuda_state *s = (krn_cuda_state *)c->dev;
  int cur = -1;
  if (cudaGetDevice(&cur) != cudaSuccess || cur != s->device) cudaSetDevice(s->device);
  return s;
}

void krn_cuda_fail(krn_cuda_state *s, const char *what, const char *detail) {
  if (s && s->capturing) { // a failure while recording a graph breaks that graph, not the ctx
    s->capture_broken = 1;
    return;
  }
  if (!s || s->failed) return;
  s->failed = 1;
  snprintf(s->err, sizeof s->err, "%s: %s", what, detail);
  fprintf(stderr, "krn cuda: %s\n", s->err);
}

int krn_cuda_check(krn_cuda_state *s, const char *what) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return 0;
  krn_cuda_fail(s, what, cudaGetErrorString(e));
  return -1;
}

void *krn_cuda_scratch(krn_cuda_state *s, int slot, size_t bytes) {
  if (bytes == 0) bytes = 16;
  if (s->scratch_bytes[slot] >= bytes) return s->scratch[slot];
  if (s->capturing) {
    s->capture_broken = 1;
    return NULL;
  }
  size_t want = bytes + bytes / 4; // some headroom so that slowly growing batches do not realloc every step
  void *p = NULL;
  if (s->scratch[slot]) {
    cudaStreamSynchronize(s->stream); // ops in flight may still read the old buffer
    cudaFree(s->scratch[slot]);
    s->scratch[slot] = NULL;
    s->scratch_bytes[slot] = 0;
  }
  cudaError_t e = cudaMalloc(&p, want);
  if (e != cudaSuccess) {
    cudaGetLastError();
    char msg[96];
    snprintf(msg, sizeof msg, "cudaMalloc of %zu bytes failed (%s)", want, cudaGetErrorString(e));
    krn_cuda_fail(s, "scratch", msg);
    return NULL;
  }
  s->scratch[slot] = p;
  s->scratch_bytes[slot] = want;
  s->epoch++;
  return p;
}

static void *cu_alloc(krn_ctx *c, size_t bytes) {
  krn_cuda_state *s = krn_cuda_st(c);
  if (!s) return NULL;
  void *p = NULL;
  if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
    cudaGetLastError(); // an out-of-memory is the caller's to report, not sticky
    return NULL;
  }
  return p;
}

static void cu_free(krn_ctx *c, void *p) {
  if (!p) return;
  krn_cuda_state *s = krn_cuda_st(c);
  if (!s) return;
  cudaStreamSynchronize(s->stream); // the stream may still use p
  cudaFree(p);
}

static void cu_upload(krn_ctx *c, void *dst, const void *host_src, size_t bytes) {
  krn_cuda_state *s = krn_cuda_st(c);
  if (!s || bytes == 0) return;
  // From pageable memory the copy has left host_src when the call returns; from pinned memory it has not,
  // so sync to keep the contract simple (the source may be reused at once).
  if (cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, s->stream) != cudaSuccess ||
      cudaStreamSynchronize(s->stream) != cudaSuccess)
    krn_cuda_check(s, "upload");
}

static void cu_download(krn_ctx *c, void *host_dst, const void *src, size_t bytes) {
  krn_cuda_state *s = krn_cuda_st(c);
  if (!s || bytes == 0) return;
  if (cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, s->stream) != cudaSuccess ||
      cudaStreamSynchronize(s->stream) != cudaSuccess) {
    krn_cuda_check(s, "download");
    memset(host_dst, 0, bytes); // never hand back uninitialised memory
  }
}

static void cu_sync(krn_ctx *c) {
  krn_cuda_state *s = krn_cuda_st(c);
  if (!s) return;
  cudaError_t e = cudaStreamSynchronize(s->stream);
  if (e != cudaSuccess) {
    cudaGetLastError();
    krn_cuda_fail(s, "sync", cudaGetErrorString(e));
  }
}

// ---- events and copies that overlap compute ----

static void *cu_event_new(krn_ctx *c) {
  krn_cuda_state *s = krn_cuda_st(c);
  cudaEvent_t e = NULL;
  if (!s) return NULL;
  if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
    krn_cuda_check(s, "event_new");
    return NULL;
  }
  return (void *)e;
}

static void cu_event_free(krn_ctx *c, void *ev) {
  krn_cuda_state *s = krn_cuda_st(c);
  if (!s || !ev) return;
  cudaEventDestroy((cudaEvent_t)ev); // legal while pending: the resources go once the event completes
}

static void cu_event_record(krn_ctx *c, void *ev) {
  krn_cuda_state *s = krn_cuda_st(c);
  if (!s || !ev) return;
  if (cudaEventRecord((cudaEvent_t)ev, s->stream) != cudaSuccess) krn_cuda_check(s, "event_record");
}

static void cu_event_wait(krn_ctx *c, void *ev) {
  krn_cuda_state *s = krn_cuda_st(c);
  if (!s || !ev) return;
  cudaError_t e = cudaEventSynchronize((cudaEvent_t)ev);
  if (e != cudaSuccess) {
    cudaGetLastError();
    krn_cuda_fail(s, "event_wait", cudaGetErrorString(e));
  }
}

static void cu_download_ready(krn_ctx *c, void *host_dst, const void *src, size_t bytes) {
  krn_cuda_state *s = krn_cuda_st(c);
  if (!s || bytes == 0) return;
  // On the side stream: the compute stream goes on while these bytes leave the device.
  if (cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, s->xfer) != cudaSuccess ||
      cudaStreamSynchronize(s->xfer) != cudaSuccess) {
    krn_cuda_check(s, "download_ready");
    memset(host_dst, 0, bytes);
  }
}

static int cu_host_register(krn_ctx *c, void *host, size_t bytes) {
  krn_cuda_state *s = krn_cuda_st(c);
  if (!s || !host || !bytes) return -1;
  if (cudaHostRegister(host, bytes, cudaHostRegisterPortable) != cudaSuccess) {
    cudaGetLastError(); // not fatal: copies from pageable memory still work, only slower
    return -1;
  }
  return 0;
}

static void cu_host_unregister(krn_ctx *c, void *host) {
  krn_cuda_state *s = krn_cuda_st(c);
  if (!s || !host) return;
  if (cudaHostUnregister(host) != cudaSuccess) cudaGetLastError();
}

static int cu_error(krn_ctx *c, char *err, size_t errlen) {
  krn_cuda_state *s = krn_cuda_st(c);
  if (!s) {
    snprintf(err, errlen, "cuda: ctx not initialised");
    return -1;
  }
  if (!s->failed) return 0;
  snprintf(err, errlen, "cuda: %s", s->err);
  return -1;
}

static void cu_ctx_fini(krn_ctx *c) {
  if (!c || !c->dev) return;
  krn_cuda_state *s = (krn_cuda_state *)c->dev;
  cudaSetDevice(s->device);
  if (s->stream) cudaStreamSynchronize(s->stream);
  for (int i = 0; i < 4; i++) cudaFree(s->scratch[i]);
  if (s->blas) cublasDestroy(s->blas);
  cudaFree(s->blas_ws);
  if (s->stream) cudaStreamDestroy(s->stream);
  if (s->xfer) cudaStreamDestroy(s->xfer);
  free(s);
  c->dev = NULL;
}

static int cu_ctx_init(krn_ctx *c, int device, char *err, size_t errlen) {
  if (!c) {
    snprintf(err, errlen, "cuda: no ctx");
    return -1;
  }
  c->dev = NULL;
  int n = krn_cuda_device_count();
  if (device < 0 || device >= n) {
    snprintf(err, errlen, "cuda: device %d does not exist (%d CUDA device%s)", device, n, n == 1 ? "" : "s");
    return -1;
  }
  krn_cuda_state *s = (krn_cuda_state *)calloc(1, sizeof *s);
  if (!s) {
    snprintf(err, errlen, "cuda: out of memory");
    return -1;
  }
  s->device = device;
  c->dev = s;
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&s->n_sm, cudaDevAttrMultiProcessorCount, device);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&s->xfer, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    snprintf(err, errlen, "cuda: device %d: %s", device, cudaGetErrorString(e));
    cudaGetLastError();
    cu_ctx_fini(c);
    return -1;
  }
  cublasStatus_t bs = cublasCreate(&s->blas);
  if (bs == CUBLAS_STATUS_SUCCESS) bs = cublasSetStream(s->blas, s->stream);
  // A workspace of its own (32 MiB, what cuBLAS asks for on Hopper), so that no cuBLAS call allocates while a
  // step graph is being captured.
  const size_t ws = (size_t)32 << 20;
  if (bs == CUBLAS_STATUS_SUCCESS && cudaMalloc(&s->blas_ws, ws) != cudaSuccess) {
    cudaGetLastError();
    snprintf(err, errlen, "cuda: device %d: cannot allocate the %zu-byte cuBLAS workspace", device, ws);
    cu_ctx_fini(c);
    return -1;
  }
  if (bs == CUBLAS_STATUS_SUCCESS) bs = cublasSetWorkspace(s->blas, s->blas_ws, ws);
  if (bs != CUBLAS_STATUS_SUCCESS) {
    snprintf(err, errlen, "cuda: cublas on device %d: %s", device, cublasGetStatusString(bs));
    cu_ctx_fini(c);
    return -1;
  }
  return 0;
}

static const krn_backend cu_backend = {
    "cuda",
    cu_alloc,
    cu_free,
    cu_upload,
    cu_download,
    cu_sync,
    krn_cuda_matmul,
    krn_cuda_get_rows,
    krn_cuda_rmsnorm,
    krn_cuda_rope,
    krn_cuda_swiglu,
    krn_cuda_softmax,
    krn_cuda_add,
    krn_cuda_kv_store,
    krn_cuda_paged_attention,
    cu_ctx_init,
    cu_ctx_fini,
    cu_event_new,
    cu_event_free,
    cu_event_record,
    cu_event_wait,
    cu_download_ready,
    cu_host_register,
    cu_host_unregister,
    cu_error,
    krn_cuda_graph_begin,
    krn_cuda_graph_end,
    krn_cuda_graph_launch,
    krn_cuda_graph_free,
    krn_cuda_geglu,
    krn_cuda_scale,
    1, // attn_window: paged_attention honors krn_attn_args.window and skips block ids < 0
    0, // kv_q8_0: no q8_0 paged attention here; a q8_0 pool on this table is refused at load (mdl_kv_type_check)
    krn_cuda_rope_freqs,
    NULL, // matmul_group: krn_matmul_group runs matmul per product (each is one GEMV launch; a graph replays them)
    krn_cuda_moe_combine,
    0,    // attn_softcap: no soft-capped paged attention here; a model that needs it (gemma2) refuses to load
    NULL, // softcap
    0,    // attn_vdim: no V-as-a-prefix-of-K attention here (MLA's latent); deepseek2 refuses to load on cuda
};

extern "C" const krn_backend *krn_cuda(void) { return &cu_backend; }

extern "C" int krn_cuda_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError(); // no driver / no device: not an error of any ctx
    return 0;
  }
  return n;
}
