// kernels/cuda/graph.cu: step graphs: stream capture of a forward step into a cudaGraphExec, replayed while its buffers stay put.
#include <stdlib.h>

#include "kernels/cuda/common.cuh"

// A recorded step and the scratch epoch it saw (replaying it after a scratch reallocation would read freed memory).
typedef struct krn_cuda_graph {
  cudaGraphExec_t exec; // (owned)
  uint64_t epoch;
} krn_cuda_graph;

int krn_cuda_graph_begin(krn_ctx *c) {
  krn_cuda_state *s = krn_cuda_st(c);
  if (!s || s->failed || s->capturing) return -1;
  // Thread-local: another thread's CUDA calls (kvxfer's nccl stream, say) do not break this capture.
  if (cudaStreamBeginCapture(s->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  s->capturing = 1;
  s->capture_broken = 0;
  return 0;
}

void *krn_cuda_graph_end(krn_ctx *c) {
  krn_cuda_state *s = krn_cuda_st(c);
  if (!s || !s->capturing) return NULL;
  cudaGraph_t g = NULL;
  cudaError_t e = cudaStreamEndCapture(s->stream, &g);
  s->capturing = 0;
  krn_cuda_graph *h = NULL;
  if (e == cudaSuccess && g && !s->capture_broken) {
    cudaGraphExec_t x = NULL;
    if (cudaGraphInstantiate(&x, g, 0) == cudaSuccess) {
      h = (krn_cuda_graph *)malloc(sizeof *h);
      if (h) {
        h->exec = x;
        h->epoch = s->epoch;
      } else {
        cudaGraphExecDestroy(x);
      }
    }
  }
  if (g) cudaGraphDestroy(g);
  cudaGetLastError(); // a broken capture is the caller's to redo without a graph, not an error of the ctx
  s->capture_broken = 0;
  return h;
}

int krn_cuda_graph_launch(krn_ctx *c, void *graph) {
  krn_cuda_state *s = krn_cuda_st(c);
  krn_cuda_graph *h = (krn_cuda_graph *)graph;
  if (!s || !h || s->failed || s->capturing || h->epoch != s->epoch) return -1;
  if (cudaGraphLaunch(h->exec, s->stream) != cudaSuccess) {
    krn_cuda_check(s, "graph_launch");
    return -1;
  }
  return 0;
}

void krn_cuda_graph_free(krn_ctx *c, void *graph) {
  krn_cuda_graph *h = (krn_cuda_graph *)graph;
  if (!h) return;
  krn_cuda_st(c); // its device current
  cudaGraphExecDestroy(h->exec);
  free(h);
}
