// tests/cuda/cuda_bench.cc: cuda backend figures: GEMV/GEMM throughput for SmolLM2 shapes, decode attention bandwidth vs peak, full model tokens/s (with and without step graphs), a cuda-vs-cpu check.
// dserve_gtest globs every .cc here into test_cuda too: the file is empty unless built as the cuda_bench target.
// Exit status: 0 measured; 1 a CUDA error during a timed loop, a failed forward pass or a failed check (the figures
// are void: a failing kernel returns early and would read as fast); 3 no CUDA device (nothing measured).
#ifdef DSERVE_CUDA_BENCH
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/krn.h"
#include "models/gguf.h"
#include "models/llama.h"
#include "tests/cuda/synth_model.h"

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

struct Bench {
  krn_ctx c{};
  const krn_backend *be = nullptr;
  std::mt19937 rng{7};
  std::vector<void *> bufs;
  ~Bench() {
    for (void *p : bufs) be->free(&c, p);
    if (c.dev) be->ctx_fini(&c);
  }
  // Device buffer of random bytes; with valid_f16_scales, every 32-element block of type t gets a finite scale.
  void *rand_buf(size_t bytes, bool valid_f16_scales, krn_type t = KRN_F32) {
    std::vector<uint8_t> h(bytes);
    for (auto &b : h) b = (uint8_t)rng();
    if (valid_f16_scales) { // keep block scales finite so the figures are not of NaN arithmetic
      const size_t bb = krn_row_size(t, 32);
      for (size_t o = 0; o + bb <= bytes; o += bb) {
        krn_f16 d = krn_f32_to_f16(0.01f);
        memcpy(&h[o], &d, 2);
        if (t == KRN_Q4_1) memcpy(&h[o + 2], &d, 2);
      }
    }
    void *p = be->alloc(&c, bytes);
    if (!p) {
      fprintf(stderr, "cuda_bench: alloc of %zu bytes failed\n", bytes);
      exit(1);
    }
    be->upload(&c, p, h.data(), bytes);
    bufs.push_back(p);
    return p;
  }
  void *f32_buf(size_t n, float lo, float hi) {
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> h(n);
    for (auto &x : h) x = u(rng);
    void *p = be->alloc(&c, n * 4);
    be->upload(&c, p, h.data(), n * 4);
    bufs.push_back(p);
    return p;
  }
};

// After a timed loop: the ctx's sticky error (kernels/cuda records the first failure of any op), then the
// runtime's own (a launch the backend did not check, a fault found by the synchronize). Any error ends the run
// with status 1: a kernel that failed returned at once, so the time just measured is not of its work.
void check_cuda(Bench &b, const char *what) {
  char err[256] = "";
  b.be->sync(&b.c);
  const cudaError_t sync = cudaDeviceSynchronize(), last = cudaGetLastError();
  if (krn_ctx_error(&b.c, err, sizeof err) == 0 && sync == cudaSuccess && last == cudaSuccess) return;
  if (!err[0]) snprintf(err, sizeof err, "%s", cudaGetErrorString(sync != cudaSuccess ? sync : last));
  printf("cuda_bench: CUDA ERROR in %s: %s; the figures are void\n", what, err);
  fflush(stdout);
  exit(1);
}

// The headline figures, gathered for the one summary line at the end (NAN: not measured).
struct Summary {
  double decode1 = NAN, decode32 = NAN, decode1_graphs = NAN, decode32_graphs = NAN, prefill2048 = NAN;
  double attn_frac = NAN, attn_copy_frac = NAN, copy_gbps = NAN;
};

// SmolLM2-135M: 30 layers of q, k, v, o, gate, up, down, then the 49152-row output.
struct Shape { int k, m; };
const Shape kLayer[] = {{576, 576}, {576, 192}, {576, 192}, {576, 576}, {576, 1536}, {576, 1536}, {1536, 576}};
const int kLayers = 30;

// Seconds per pass of all matmuls of the model at n rows, weights in Q4_1 (distinct per layer: no L2 reuse).
double matmul_pass(Bench &b, const std::vector<void *> &w, void *out_w, int n) {
  float *x = (float *)b.f32_buf((size_t)n * 1536, -1, 1);
  float *y = (float *)b.be->alloc(&b.c, (size_t)n * 49152 * 4);
  b.bufs.push_back(y);
  auto pass = [&]() {
    for (int l = 0; l < kLayers; l++)
      for (int i = 0; i < 7; i++) b.be->matmul(&b.c, y, w[l * 7 + i], KRN_Q4_1, x, n, kLayer[i].k, kLayer[i].m);
    b.be->matmul(&b.c, y, out_w, KRN_Q4_1, x, n, 576, 49152);
  };
  pass();
  b.be->sync(&b.c);
  const int iters = n >= 512 ? 5 : 30;
  double t0 = now_s();
  for (int i = 0; i < iters; i++) pass();
  b.be->sync(&b.c);
  const double t = (now_s() - t0) / iters;
  check_cuda(b, n >= 512 ? "the matmul prefill loop" : "the matmul decode loop");
  return t;
}

// Decode attention over batch rows each at context ctx; returns K/V bytes read per second.
double attn_bw(Bench &b, int batch, int ctx, int n_head, int n_kv, int hd) {
  const int bs = 16, max_blocks = (ctx + bs - 1) / bs, n_blocks = batch * max_blocks;
  const size_t kv_bytes = (size_t)n_blocks * bs * n_kv * hd * 2;
  void *kc = b.be->alloc(&b.c, kv_bytes), *vc = b.be->alloc(&b.c, kv_bytes);
  if (!kc || !vc) {
    fprintf(stderr, "cuda_bench: alloc of 2 x %zu bytes of KV failed\n", kv_bytes);
    exit(1);
  }
  // The kernel's speed does not depend on the values; a constant keeps them finite.
  std::vector<uint16_t> fill(kv_bytes / 2, krn_f32_to_f16(0.5f));
  b.be->upload(&b.c, kc, fill.data(), kv_bytes);
  b.be->upload(&b.c, vc, fill.data(), kv_bytes);
  std::vector<int32_t> seq(batch), pos(batch), bt((size_t)batch * max_blocks);
  for (int i = 0; i < batch; i++) seq[i] = i, pos[i] = ctx - 1;
  std::vector<int32_t> ids(n_blocks);
  for (int i = 0; i < n_blocks; i++) ids[i] = i;
  std::shuffle(ids.begin(), ids.end(), b.rng);
  for (size_t i = 0; i < bt.size(); i++) bt[i] = ids[i];
  auto up = [&](const std::vector<int32_t> &v) {
    void *p = b.be->alloc(&b.c, v.size() * 4);
    b.be->upload(&b.c, p, v.data(), v.size() * 4);
    b.bufs.push_back(p);
    return (const int32_t *)p;
  };
  krn_attn_args a{};
  a.n_tokens = batch;
  a.n_head = n_head;
  a.n_kv_head = n_kv;
  a.head_dim = hd;
  a.block_size = bs;
  a.tok_seq = up(seq);
  a.tok_pos = up(pos);
  a.block_tables = up(bt);
  a.max_blocks = max_blocks;
  a.k_cache = kc;
  a.v_cache = vc;
  a.kv_type = KRN_F16;
  a.scale = 1.0f / std::sqrt((float)hd);
  float *q = (float *)b.f32_buf((size_t)batch * n_head * hd, -1, 1);
  float *out = (float *)b.be->alloc(&b.c, (size_t)batch * n_head * hd * 4);
  b.bufs.push_back(out);
  b.be->paged_attention(&b.c, out, q, &a);
  b.be->sync(&b.c);
  const int iters = 20;
  double t0 = now_s();
  for (int i = 0; i < iters; i++) b.be->paged_attention(&b.c, out, q, &a);
  b.be->sync(&b.c);
  const double t = (now_s() - t0) / iters;
  check_cuda(b, "the decode attention loop");
  const double bytes = (double)batch * ctx * n_kv * hd * 2 /* K and V */ * 2 /* F16 */;
  b.be->free(&b.c, kc);
  b.be->free(&b.c, vc);
  return bytes / t;
}

void model_figures(Bench &b, Summary &sum) {
  const char *path = DSERVE_SOURCE_DIR "/models/weights/SmolLM2-135M-Instruct.Q4_1.gguf";
  char err[256] = "";
  mdl_gguf *g = nullptr;
  std::vector<uint8_t> synth; // the stand-in's bytes, alive while g is
  if (mdl_gguf_open(path, &g, err, sizeof err)) {
    // Speed does not depend on the weights' values: a model of the same shapes stands in.
    synth = dserve_test::synth_model(dserve_test::smollm2_shape(), 3);
    if (mdl_gguf_from_memory(synth.data(), synth.size(), &g, err, sizeof err)) {
      printf("model: FAILED (synthetic model: %s)\n", err);
      exit(1);
    }
    printf("model: the SmolLM2-135M GGUF is absent; figures are for a synthetic model of its shapes (random Q4_1 weights)\n");
  } else {
    printf("model: %s\n", path);
  }
  mdl_llama *m = nullptr;
  if (mdl_llama_load(g, &b.c, &m, err, sizeof err)) {
    printf("model: FAILED (mdl_llama_load on cuda: %s)\n", err);
    exit(1);
  }
  const mdl_llama_cfg *cfg = mdl_llama_config(m);
  const int bs = 16, ctx = 2048 + 64, per_seq = (ctx + bs - 1) / bs, n_seqs = 32;
  mdl_kv kv{};
  kv.type = KRN_F16;
  kv.block_size = bs;
  kv.n_blocks = per_seq * n_seqs;
  kv.base = b.be->alloc(&b.c, mdl_kv_block_bytes(cfg, KRN_F16, bs) * kv.n_blocks);
  std::vector<int32_t> bt((size_t)kv.n_blocks);
  for (int i = 0; i < kv.n_blocks; i++) bt[i] = i;
  std::vector<int32_t> toks(2048);
  for (auto &t : toks) t = (int32_t)(b.rng() % cfg->n_vocab);
  std::vector<float> logits((size_t)n_seqs * cfg->n_vocab);
  auto step = [&](int n, int n_new, int pos0) {
    std::vector<mdl_seq> seqs(n);
    for (int i = 0; i < n; i++) {
      seqs[i].tokens = toks.data();
      seqs[i].n_tokens = n_new;
      seqs[i].pos0 = pos0;
      seqs[i].block_table = bt.data() + (size_t)i * per_seq;
      seqs[i].n_blocks = per_seq;
      seqs[i].want_logits = 1;
    }
    return mdl_llama_forward(m, &kv, seqs.data(), n, logits.data(), nullptr, nullptr, err, sizeof err);
  };
  if (!kv.base || step(1, 2048, 0)) {
    printf("model: FAILED (forward on cuda: %s)\n", kv.base ? err : "KV alloc failed");
    exit(1);
  } else {
    double t0 = now_s();
    const int pbad = step(1, 2048, 0);
    const double tp = now_s() - t0;
    if (pbad) {
      printf("model prefill 2048 tokens: FORWARD FAILED (%s)\n", err);
      exit(1);
    }
    check_cuda(b, "the model prefill");
    printf("model prefill 2048 tokens: %.0f tokens/s\n", 2048 / tp);
    sum.prefill2048 = 2048 / tp;
    for (int graphs : {0, 1}) {
      if (mdl_llama_set_graphs(m, graphs, err, sizeof err)) {
        printf("model decode with graphs: FAILED (%s)\n", err);
        break;
      }
      for (int batch : {1, 32}) {
        step(batch, 1, 2048);
        step(batch, 1, 2048); // with graphs: the second step of a shape records its graph
        const int iters = 20;
        long r0 = 0, r1 = 0;
        mdl_llama_graph_stats(m, &r0, nullptr);
        t0 = now_s();
        int bad = 0;
        for (int i = 0; i < iters; i++) bad |= step(batch, 1, 2048 + i % 64);
        const double td = (now_s() - t0) / iters;
        mdl_llama_graph_stats(m, &r1, nullptr);
        printf("model decode batch %d at context 2048%s: %.0f tokens/s (%.2f ms/step)%s%s\n", batch,
               graphs ? " (cuda graphs)" : "", batch / td, td * 1e3,
               graphs ? (r1 - r0 == iters ? ", every step replayed" : ", NOT every step replayed") : "",
               bad ? " FORWARD FAILED" : "");
        if (bad) {
          printf("model decode: FAILED (%s)\n", err);
          exit(1);
        }
        check_cuda(b, "the model decode loop");
        (batch == 1 ? (graphs ? sum.decode1_graphs : sum.decode1) : (graphs ? sum.decode32_graphs : sum.decode32)) =
            batch / td;
      }
    }
    if (mdl_llama_set_graphs(m, 0, err, sizeof err)) printf("model graphs off: FAILED (%s)\n", err);
  }
  b.be->free(&b.c, kv.base);
  mdl_llama_free(m);
  mdl_gguf_close(g);
}

// Greedy decoding of a small synthetic model on cuda and on the scalar f32 reference: the correctness line of a run
// without GoogleTest (scripts/gpu-check.sh on a bare machine), plain and with step graphs. (tests/cuda's
// ForwardMatchesCpuOnSyntheticModel holds the logits to a derived tolerance; this line only catches gross errors.)
int check_line(Bench &b) {
  int ok = 1;
  auto bytes = dserve_test::synth_model(dserve_test::tiny_shape(), 11);
  char err[256] = "";
  mdl_gguf *g = nullptr;
  if (mdl_gguf_from_memory(bytes.data(), bytes.size(), &g, err, sizeof err)) {
    printf("check: FAILED (synthetic model: %s)\n", err);
    return 0;
  }
  krn_ctx host{};
  host.be = krn_cpu_scalar();
  for (int graphs : {0, 1}) {
    mdl_llama *mc = nullptr, *mg = nullptr;
    if (mdl_llama_load(g, &host, &mc, err, sizeof err) || mdl_llama_load(g, &b.c, &mg, err, sizeof err) ||
        (graphs && mdl_llama_set_graphs(mg, 1, err, sizeof err))) {
      printf("check: FAILED (%s)\n", err);
      mdl_llama_free(mc);
      mdl_llama_free(mg);
      ok = 0;
      break;
    }
    const mdl_llama_cfg *cfg = mdl_llama_config(mc);
    const int V = cfg->n_vocab, nb = 4;
    const size_t kvb = mdl_kv_block_bytes(cfg, KRN_F16, 16) * nb;
    std::vector<uint8_t> hpool(kvb);
    mdl_kv kc{}, kg{}; // one layer group each: the plain layout
    kc.base = hpool.data();
    kg.base = b.be->alloc(&b.c, kvb);
    kc.type = kg.type = KRN_F16;
    kc.n_blocks = kg.n_blocks = nb;
    kc.block_size = kg.block_size = 16;
    std::vector<int32_t> toks = {5, 17, 300, 42, 8, 999, 3}, bt = {2, 0, 3, 1};
    std::vector<float> lc(V), lg(V);
    int equal = 0, clear = 0, steps = 24, failed = 0;
    double worst = 0;
    for (int step = 0; step < steps && kg.base && !failed; step++) {
      mdl_seq sq{};
      sq.n_tokens = step ? 1 : (int)toks.size();
      sq.pos0 = step ? (int)toks.size() - 1 : 0;
      sq.tokens = toks.data() + sq.pos0;
      sq.block_table = bt.data();
      sq.n_blocks = nb;
      sq.want_logits = 1;
      failed = mdl_llama_forward(mc, &kc, &sq, 1, lc.data(), nullptr, nullptr, err, sizeof err) ||
               mdl_llama_forward(mg, &kg, &sq, 1, lg.data(), nullptr, nullptr, err, sizeof err);
      int tc = 0, tg = 0;
      for (int i = 1; i < V; i++) {
        tc = lc[i] > lc[tc] ? i : tc;
        tg = lg[i] > lg[tg] ? i : tg;
      }
      float second = -1e30f, mx = 0;
      for (int i = 0; i < V; i++) {
        if (i != tc) second = std::max(second, lc[i]);
        mx = std::max(mx, std::fabs(lc[i]));
      }
      for (int i = 0; i < V; i++) worst = std::max(worst, (double)std::fabs(lg[i] - lc[i]) / std::max(1.0f, mx));
      if (lc[tc] - second > 0.05f) clear++, equal += tg == tc;
      toks.push_back(tc);
    }
    long replayed = 0;
    mdl_llama_graph_stats(mg, &replayed, nullptr);
    const bool pass = kg.base && !failed && equal == clear && clear >= steps / 2 && worst < 2e-2 &&
                      (!graphs || replayed > 0);
    ok &= pass;
    if (!kg.base || failed)
      printf("check: FAILED (%s)\n", kg.base ? err : "KV alloc failed");
    else
      printf("check: cuda vs cpu on a synthetic model%s: greedy tokens %d/%d equal, max logit error %.2g%s -> %s\n",
             graphs ? " (cuda graphs)" : "", equal, clear, worst,
             graphs ? (replayed > 0 ? "" : " (no step replayed!)") : "",
             pass ? "ok" : "MISMATCH");
    b.be->free(&b.c, kg.base);
    mdl_llama_free(mc);
    mdl_llama_free(mg);
  }
  mdl_gguf_close(g);
  return ok;
}

// Device-to-device copy bandwidth (bytes read plus written per second): the practical ceiling of a
// memory-bound kernel, to read the attention figures against besides the nominal peak.
double copy_bandwidth(Bench &b) {
  const size_t bytes = (size_t)1 << 30;
  void *src = b.be->alloc(&b.c, bytes), *dst = b.be->alloc(&b.c, bytes);
  double bw = 0;
  if (src && dst) {
    cudaStream_t st = 0;
    cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice); // warm-up (legacy stream: synchronous to the host)
    const int iters = 10;
    double t0 = now_s();
    for (int i = 0; i < iters; i++) cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st);
    cudaStreamSynchronize(st);
    bw = 2.0 * bytes * iters / (now_s() - t0);
    check_cuda(b, "the device copy loop");
  } else {
    printf("cuda_bench: FAILED: could not allocate 2 x 1 GiB for the copy bandwidth\n");
    exit(1);
  }
  b.be->free(&b.c, src);
  b.be->free(&b.c, dst);
  return bw;
}

// Peak memory bandwidth: DSERVE_PEAK_GBPS if set, else from the memory clock and bus width, else by name.
double peak_bandwidth(const cudaDeviceProp &prop, const char **how) {
  if (const char *e = getenv("DSERVE_PEAK_GBPS")) {
    *how = "DSERVE_PEAK_GBPS";
    return atof(e) * 1e9;
  }
  int clk_khz = 0, bus_bits = 0;
  cudaDeviceGetAttribute(&clk_khz, cudaDevAttrMemoryClockRate, 0);
  cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, 0);
  cudaGetLastError();
  if (clk_khz > 0 && bus_bits > 0) {
    *how = "2 x memory clock x bus width";
    return 2.0 * clk_khz * 1e3 * bus_bits / 8; // bytes/s, DDR
  }
  struct { const char *name; double gbps; } known[] = {{"H200", 4800}, {"H100 NVL", 3900}, {"H100 PCIe", 2000},
                                                        {"H100", 3350}, {"A100", 2039}, {"L40S", 864}};
  for (auto &k : known)
    if (strstr(prop.name, k.name)) {
      *how = "datasheet figure by device name";
      return k.gbps * 1e9;
    }
  *how = "unknown (set DSERVE_PEAK_GBPS)";
  return 0;
}

} // namespace

int main() {
  Bench b;
  b.be = krn_cuda();
  if (!b.be || krn_cuda_device_count() == 0) {
    printf("cuda_bench: no CUDA device; nothing measured\n");
    return 3;
  }
  Summary sum;
  char err[256] = "";
  b.c.be = b.be;
  if (b.be->ctx_init(&b.c, 0, err, sizeof err)) {
    fprintf(stderr, "cuda_bench: %s\n", err);
    return 1;
  }
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  const char *how = "";
  double peak = peak_bandwidth(prop, &how);
  printf("device: %s, %d SMs, peak memory bandwidth %.0f GB/s (%s)\n", prop.name, prop.multiProcessorCount,
         peak / 1e9, how);
  if (!(peak > 0)) peak = NAN; // the fractions below print as nan rather than as a division by zero
  const double copy = copy_bandwidth(b);
  sum.copy_gbps = copy / 1e9;
  printf("device copy bandwidth (bytes read + written): %.0f GB/s = %.0f%% of peak\n", copy / 1e9, 100 * copy / peak);
  const int checked = check_line(b);
  check_cuda(b, "the cuda-vs-cpu check");

  std::vector<void *> w;
  for (int l = 0; l < kLayers; l++)
    for (int i = 0; i < 7; i++)
      w.push_back(b.rand_buf(krn_row_size(KRN_Q4_1, kLayer[i].k) * kLayer[i].m, true, KRN_Q4_1));
  void *out_w = b.rand_buf(krn_row_size(KRN_Q4_1, 576) * 49152, true, KRN_Q4_1);
  size_t wbytes = krn_row_size(KRN_Q4_1, 576) * 49152;
  for (int i = 0; i < 7; i++) wbytes += krn_row_size(KRN_Q4_1, kLayer[i].k) * kLayer[i].m * kLayers;
  for (int n : {1, 32}) {
    const double t = matmul_pass(b, w, out_w, n);
    printf("matmul decode proxy (all SmolLM2 Q4_1 matmuls) batch %d: %.3f ms/step = %.0f tokens/s, weights %.0f GB/s (%.0f%% of peak)\n",
           n, t * 1e3, n / t, wbytes / t / 1e9, 100 * wbytes / t / peak);
  }
  {
    const double t = matmul_pass(b, w, out_w, 2048);
    const double flops = 2.0 * 2048 * (double)wbytes / krn_row_size(KRN_Q4_1, 32) * 32;
    printf("matmul prefill 2048 tokens: %.2f ms = %.0f tokens/s, %.1f TFLOP/s\n", t * 1e3, 2048 / t, flops / t / 1e12);
  }
  struct { const char *name; int nh, nkv, hd; } cfgs[] = {{"SmolLM2 9q/3kv x64", 9, 3, 64}, {"Llama-8B 32q/8kv x128", 32, 8, 128}};
  for (auto &cf : cfgs)
    for (int ctx : {4096, 8192, 16384, 32768}) {
      const double bw = attn_bw(b, 32, ctx, cf.nh, cf.nkv, cf.hd);
      printf("decode attention %s batch 32 context %d: %.0f GB/s = %.0f%% of peak (%.0f%% of the copy bandwidth)\n",
             cf.name, ctx, bw / 1e9, 100 * bw / peak, 100 * bw / copy);
      if (ctx == 32768 && cf.nh == 32) sum.attn_frac = bw / peak, sum.attn_copy_frac = bw / copy;
    }
  model_figures(b, sum);
  // One line for scripts/gpu-check.sh's summary (nan: not measured; the lines above say why).
  printf("bench summary: decode batch 1 %.0f tok/s (graphs %.0f), batch 32 %.0f tok/s (graphs %.0f), prefill 2048 "
         "%.0f tok/s, decode attention (Llama-8B shape, batch 32, context 32768) %.0f%% of HBM peak (target >= 60%%: "
         "%s; %.0f%% of the %.0f GB/s copy bandwidth), cuda-vs-cpu check %s\n",
         sum.decode1, sum.decode1_graphs, sum.decode32, sum.decode32_graphs, sum.prefill2048, 100 * sum.attn_frac,
         sum.attn_frac >= 0.6 ? "met" : "NOT met", 100 * sum.attn_copy_frac, sum.copy_gbps, checked ? "ok" : "MISMATCH");
  return checked ? 0 : 1;
}
#endif // DSERVE_CUDA_BENCH
