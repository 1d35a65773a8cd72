// tests/kv/test_latent.cc: a one-part KV cache (MLA's latent row, deepseek2: kv_lora_rank 512 + rope 64 values per
// position and layer) through every KV path: the pool, its blocks, the wire layout and its check, the prefix store's
// host and disk tiers, and a layer-wise push over kvxfer (tcp, shm, a staged receiver) into a peer's pool.
#include "tests/kv/prefix_util.h"

#include <chrono>
#include <random>
#include <string>
#include <tuple>
#include <vector>

extern "C" {
#include "kv/stage.h"
#include "kv/wire.h"
#include "kvxfer/kvx.h"
}

namespace {

using namespace kvtest;

// DeepSeek-V2-Lite's attention at a few layers: 16 heads, kv_lora_rank 512, rope 64 (one 576-value row per layer).
void latent_cfg(mdl_llama_cfg *c, int n_layer) {
  *c = mdl_llama_cfg{};
  c->n_layer = n_layer;
  c->n_embd = 2048;
  c->n_head = 16;
  c->n_kv_head = 16;
  c->head_dim = 192; // qk_nope 128 + rope 64: the query's, not the cache's
  c->head_dim_v = 128;
  c->kv_lora_rank = 512;
  c->n_rot = 64;
}

// A GQA model of the same hidden size: 16 heads of 128, 4 KV heads (K and V rows of 512 values each).
void gqa_cfg(mdl_llama_cfg *c, int n_layer) {
  *c = mdl_llama_cfg{};
  c->n_layer = n_layer;
  c->n_embd = 2048;
  c->n_head = 16;
  c->n_kv_head = 4;
  c->head_dim = 128;
}

std::vector<uint8_t> rnd(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto &b : v) b = (uint8_t)rng();
  return v;
}

struct KvLatent : ::testing::TestWithParam<krn_type> {
  krn_backend be{};
  krn_ctx kc{};
  mdl_llama_cfg lat{}, gqa{};
  char err[512] = {0};
  std::vector<kv_pool *> pools;
  void SetUp() override {
    be.name = "test";
    be.alloc = t_alloc;
    be.free = t_free;
    be.kv_q8_0 = 1;
    kc.be = &be;
    latent_cfg(&lat, 4);
    gqa_cfg(&gqa, 4);
  }
  void TearDown() override {
    for (kv_pool *p : pools) kv_pool_free(p);
  }
  kv_pool *pool(const mdl_llama_cfg &c, krn_type t, int blocks) {
    kv_pool_opts o{};
    o.type = t;
    o.block_size = 16;
    o.budget_bytes = mdl_kv_block_bytes(&c, t, 16) * (size_t)blocks;
    kv_pool *p = nullptr;
    EXPECT_EQ(kv_pool_new(&c, &kc, &o, &p, err, sizeof err), 0) << err;
    if (p) pools.push_back(p);
    return p;
  }
};

// One part of 576 values per position and layer: a block is n_layer chunks (not 2 n_layer), chunks tile the pool in
// (layer, page) order, and a block's bytes read out of one pool and written into another land chunk for chunk.
TEST_P(KvLatent, PoolHoldsOneLatentRowPerLayer) {
  krn_type t = GetParam();
  EXPECT_EQ(mdl_kv_parts(&lat), 1);
  EXPECT_EQ(mdl_kv_width(&lat), 576);
  EXPECT_EQ(mdl_kv_parts(&gqa), 2);
  EXPECT_EQ(mdl_kv_width(&gqa), 512);
  size_t row = t == KRN_F16 ? 576u * 2 : 576u / 32 * 34;
  EXPECT_EQ(mdl_kv_block_bytes(&lat, t, 16), 4u * 16 * row);
  kv_pool *a = pool(lat, t, 6), *b = pool(lat, t, 6);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(kv_pool_total_blocks(a), 6);
  const mdl_kv *ka = kv_pool_kv(a), *kb = kv_pool_kv(b);
  size_t chunk = mdl_kv_chunk_bytes(&lat, ka), bytes = 0;
  EXPECT_EQ(chunk, 16 * row);
  char *base = (char *)kv_pool_base(a, &bytes);
  EXPECT_EQ(bytes, 6 * mdl_kv_block_bytes(&lat, t, 16));
  for (int l = 0; l < 4; l++)
    for (int pg = 0; pg < 6; pg++)
      EXPECT_EQ((char *)mdl_kv_chunk(&lat, ka, l, 0, pg), base + ((size_t)l * 6 + (size_t)pg) * chunk)
          << l << " " << pg;
  int32_t ia[2], ib[3];
  ASSERT_EQ(kv_pool_alloc(a, ia, 2), 0);
  ASSERT_EQ(kv_pool_alloc(b, ib, 3), 0); // b's third id differs from a's second
  std::vector<uint8_t> src = rnd(bytes, 7);
  std::memcpy(base, src.data(), bytes);
  std::vector<uint8_t> buf(kv_pool_block_bytes(a));
  ASSERT_EQ(buf.size(), 4 * chunk);
  ASSERT_EQ(kv_pool_read_block(a, ia[1], buf.data()), 0);
  ASSERT_EQ(kv_pool_write_block(b, ib[2], buf.data()), 0);
  for (int l = 0; l < 4; l++) {
    EXPECT_EQ(std::memcmp(buf.data() + (size_t)l * chunk, mdl_kv_chunk(&lat, ka, l, 0, ia[1]), chunk), 0) << l;
    EXPECT_EQ(std::memcmp(mdl_kv_chunk(&lat, kb, l, 0, ib[2]), mdl_kv_chunk(&lat, ka, l, 0, ia[1]), chunk), 0) << l;
  }
}

// hello_ok's kv_layout carries parts and width through JSON; the peer's check accepts the same latent layout (chunk
// addresses in its pool as ours) and refuses a K-and-V pool of the same layers and type, naming both layouts.
TEST_P(KvLatent, WireLayoutCarriesPartsAndWidthAndRefusesAnother) {
  krn_type t = GetParam();
  kv_pool *l1 = pool(lat, t, 5), *l2 = pool(lat, t, 5), *g = pool(gqa, t, 5);
  ASSERT_TRUE(l1 && l2 && g);
  prt_kv_layout in = kv_wire_layout(l1), back{};
  EXPECT_EQ(in.parts, 1);
  EXPECT_EQ(in.width, 576);
  cJSON *msg = cJSON_CreateObject();
  ASSERT_EQ(prt_kv_layout_add(msg, &in), 0);
  char *txt = cJSON_PrintUnformatted(msg);
  EXPECT_NE(std::strstr(txt, "\"parts\":1,\"width\":576"), nullptr) << txt;
  cJSON *parsed = cJSON_Parse(txt);
  ASSERT_EQ(prt_kv_layout_read(parsed, "hello_ok", &back, err, sizeof err), 0) << err;
  EXPECT_EQ(std::make_tuple(back.n_layer, back.parts, back.width, back.type, back.block_size, back.n_blocks,
                            back.n_groups, back.base),
            std::make_tuple(in.n_layer, in.parts, in.width, in.type, in.block_size, in.n_blocks, in.n_groups, in.base));
  cJSON_free(txt);
  cJSON_Delete(parsed);
  cJSON_Delete(msg);
  wrk_kv_remote r{};
  ASSERT_EQ(kv_wire_check_layout(&back, l2, &r, err, sizeof err), 0) << err;
  EXPECT_EQ(r.n_parts, 1);
  EXPECT_EQ(r.chunk_bytes, mdl_kv_chunk_bytes(&lat, kv_pool_kv(l1)));
  for (int l = 0; l < 4; l++) // the peer's chunk addresses are where its own pool keeps them
    for (int pg = 0; pg < 5; pg++)
      EXPECT_EQ(wrk_kv_remote_chunk(&r, l, 0, pg), (uint64_t)(uintptr_t)mdl_kv_chunk(&lat, kv_pool_kv(l1), l, 0, pg));
  prt_kv_layout lg = kv_wire_layout(g);
  EXPECT_LT(kv_wire_check_layout(&lg, l1, &r, err, sizeof err), 0);
  EXPECT_NE(std::strstr(err, "the peer's pool holds 4 layers x 2 parts of 512 values"), nullptr) << err;
  EXPECT_NE(std::strstr(err, "this worker's 4 layers x 1 part of 576"), nullptr) << err;
  EXPECT_LT(kv_wire_check_layout(&in, g, &r, err, sizeof err), 0);
  EXPECT_NE(std::strstr(err, "the peer's pool holds 4 layers x 1 part of 576 values"), nullptr) << err;
  EXPECT_NE(std::strstr(err, "this worker's 4 layers x 2 parts of 512"), nullptr) << err;
  // Bytes a handoff moves: 576 values per position and layer against K and V's 2 x 512.
  EXPECT_NEAR(kv_wire_handoff_bytes(l1, 1000, 0, nullptr) / kv_wire_handoff_bytes(g, 1000, 0, nullptr), 576.0 / 1024,
              1e-9);
}

INSTANTIATE_TEST_SUITE_P(Types, KvLatent, ::testing::Values(KRN_F16, KRN_Q8_0),
                         [](const ::testing::TestParamInfo<krn_type> &i) {
                           return std::string(krn_kv_type_str(i.param));
                         });

// The prefix store's tiers move whole latent blocks: spilled to host DRAM and disk, then restored byte for byte.
struct LatentPrefix : Prefix {
  void SetUp() override {
    Prefix::SetUp();
    latent_cfg(&cfg, 3);
  }
};

TEST_F(LatentPrefix, TiersSpillAndRestoreLatentBlocks) {
  make_pool(6);
  EXPECT_EQ(kv_pool_block_bytes(pool), 3u * BS * 576 * 4); // f32: one 576-value row per layer and position
  std::string path = std::string(::testing::TempDir()) + "dserve_latent_" + std::to_string(getpid()) + ".kv";
  make_store(1, nullptr, 0, 1, 3, path.c_str());
  size_t bb = kv_pool_block_bytes(pool);
  std::vector<int32_t> p = seq(4 * BS + 1, 70);
  kv_blocks s{};
  ASSERT_EQ(kv_blocks_reserve(pool, &s, (int)p.size()), 0);
  for (int i = 0; i < 4; i++) ASSERT_EQ(kv_pool_write_block(pool, s.ids[i], rnd(bb, 100 + i).data()), 0);
  EXPECT_EQ(kv_prefix_insert(st, p.data(), (int)p.size(), s.ids, s.n), 4);
  kv_blocks_release(pool, &s);
  EXPECT_EQ(kv_prefix_evict_for(st, 6), 4);
  kv_prefix_stats t = stats();
  EXPECT_EQ(t.blocks[0], 0);
  EXPECT_EQ(t.blocks[1], 1);
  EXPECT_EQ(t.blocks[2], 3);
  std::vector<int32_t> scrub(6);
  ASSERT_EQ(kv_pool_alloc(pool, scrub.data(), 6), 0);
  std::vector<uint8_t> zero(bb, 0);
  for (int32_t id : scrub) ASSERT_EQ(kv_pool_write_block(pool, id, zero.data()), 0);
  unref_all(scrub);
  std::vector<int32_t> r(6);
  ASSERT_EQ(kv_prefix_restore(st, p.data(), (int)p.size(), 0, r.data(), 6, err, sizeof err), 4) << err;
  std::vector<uint8_t> got(bb);
  for (int i = 0; i < 4; i++) {
    ASSERT_EQ(kv_pool_read_block(pool, r[i], got.data()), 0);
    EXPECT_EQ(got, rnd(bb, 100 + i)) << "block " << i;
  }
  r.resize(4);
  unref_all(r);
}

// A layer-wise push of latent blocks, as a prefill worker hands a prompt off and a decode worker receives it: the
// decode side's hello layout checked, its block table read, layers [0, 1) then [1, n_layer) written over kvxfer with
// the notification after the last, then (a staged receiver) copied from its mirror into its pool. Every chunk lands.
void dev_copy(krn_ctx *, void *d, const void *s, size_t n) { std::memcpy(d, s, n); }
int dev_init(krn_ctx *, int, char *, size_t) { return 0; }
int dev_reg(krn_ctx *, void *, size_t) { return 0; }
void dev_unreg(krn_ctx *, void *) {}

struct LatentPush : ::testing::TestWithParam<std::tuple<const char *, krn_type, bool>> {
  krn_backend host{}, dev{};
  krn_ctx kp{}, kd{};
  mdl_llama_cfg cfg{};
  char err[512] = {0};
  void SetUp() override {
    host.name = "host";
    host.alloc = t_alloc;
    host.free = t_free;
    host.kv_q8_0 = 1;
    dev = host;
    dev.name = "fakedev";
    dev.ctx_init = dev_init;
    dev.upload = dev_copy;
    dev.download = dev_copy;
    dev.download_ready = dev_copy;
    dev.host_register = dev_reg;
    dev.host_unregister = dev_unreg;
    latent_cfg(&cfg, 3);
  }
  kvx_agent *agent(const char *name, const char *backend) {
    kvx_opts o{};
    o.backend = backend;
    o.listen_host = "127.0.0.1";
    o.secret = "s3cret";
    o.timeout_ms = 5000;
    kvx_agent *a = kvx_agent_new(name, &o, err, sizeof err);
    EXPECT_NE(a, nullptr) << err;
    return a;
  }
};

TEST_P(LatentPush, LayerWisePushLandsEveryLatentChunk) {
  const char *backend = std::get<0>(GetParam());
  krn_type t = std::get<1>(GetParam());
  bool staged = std::get<2>(GetParam());
  kvx_agent *ap = agent("lat-p", backend), *ad = agent("lat-d", backend);
  ASSERT_TRUE(ap && ad);
  kp.be = &host;
  kd.be = staged ? &dev : &host;
  kv_pool_opts o{};
  o.type = t;
  o.block_size = 16;
  o.budget_bytes = mdl_kv_block_bytes(&cfg, t, 16) * 8;
  o.shareable = !staged; // a host decode pool is shareable, as the decode worker makes it (shm maps it)
  kv_pool *pp = nullptr, *pd = nullptr;
  ASSERT_EQ(kv_pool_new(&cfg, &kp, &o, &pp, err, sizeof err), 0) << err;
  ASSERT_EQ(kv_pool_new(&cfg, &kd, &o, &pd, err, sizeof err), 0) << err;
  cfg_worker wc{};
  snprintf(wc.name, sizeof wc.name, "d");
  snprintf(wc.kvx_backend, sizeof wc.kvx_backend, "%s", backend);
  snprintf(wc.kvx_staging, sizeof wc.kvx_staging, "auto");
  kv_stage *sp = nullptr, *sd = nullptr;
  kvx_region *rp = nullptr, *rd = nullptr;
  ASSERT_EQ(kv_stage_open(ap, pp, &kp, &wc, &sp, &rp, err, sizeof err), 0) << err;
  ASSERT_EQ(kv_stage_open(ad, pd, &kd, &wc, &sd, &rd, err, sizeof err), 0) << err;
  EXPECT_EQ(sd != nullptr, staged);
  // the hello: decode's metadata and layout reach prefill, which checks the layout
  char *md = kv_wire_pack_md(ad);
  ASSERT_NE(md, nullptr);
  char peer[KVX_MAX_NAME];
  ASSERT_EQ(kv_wire_load_md(md, ap, peer, sizeof peer, err, sizeof err), 0) << err;
  free(md);
  prt_kv_layout lay = kv_wire_layout(pd);
  wrk_kv_remote remote{};
  ASSERT_EQ(kv_wire_check_layout(&lay, pp, &remote, err, sizeof err), 0) << err;
  // prefill computed three blocks; decode reserved three others and sent their table
  int32_t mine[3], theirs[4];
  ASSERT_EQ(kv_pool_alloc(pp, mine, 3), 0);
  ASSERT_EQ(kv_pool_alloc(pd, theirs, 4), 0); // theirs[1..3]: ids other than prefill's
  size_t bytes = 0;
  uint8_t *pbase = (uint8_t *)kv_pool_base(pp, &bytes);
  std::vector<uint8_t> src = rnd(bytes, 11);
  std::memcpy(pbase, src.data(), bytes);
  prt_kv_table tab{};
  ASSERT_EQ(kv_wire_table(pd, theirs + 1, 3, &tab), 0);
  int32_t *pages = nullptr;
  int n = 0;
  ASSERT_EQ(kv_wire_read_table(&tab, &remote, &pages, &n), 0);
  ASSERT_EQ(n, 3);
  kvx_xfer *x1 = nullptr, *x2 = nullptr;
  ASSERT_EQ(kv_wire_write_blocks(ap, pp, peer, &remote, mine, pages, 3, 0, 1, nullptr, 0, &x1, err, sizeof err), 0)
      << err;
  ASSERT_EQ(kv_wire_write_blocks(ap, pp, peer, &remote, mine, pages, 3, 1, 3, "done", 4, &x2, err, sizeof err), 0)
      << err;
  free(pages);
  ASSERT_TRUE(x1 && x2);
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  int s1 = KVX_PENDING, s2 = KVX_PENDING, got = 0;
  while ((s1 == KVX_PENDING || s2 == KVX_PENDING || !got) && std::chrono::steady_clock::now() < end) {
    kvx_progress(ap, 10);
    kvx_progress(ad, 10);
    if (s1 == KVX_PENDING) s1 = kvx_xfer_poll(x1);
    if (s2 == KVX_PENDING) s2 = kvx_xfer_poll(x2);
    kvx_notif nt[4];
    int k = kvx_get_notifs(ad, nt, 4);
    for (int i = 0; i < k; i++) {
      got += nt[i].len == 4 && !std::memcmp(nt[i].msg, "done", 4);
      free(nt[i].msg);
    }
  }
  EXPECT_EQ(s1, KVX_DONE) << kvx_xfer_error(x1);
  EXPECT_EQ(s2, KVX_DONE) << kvx_xfer_error(x2);
  EXPECT_EQ(got, 1);
  kvx_xfer_free(x1);
  kvx_xfer_free(x2);
  if (sd) { // a staged receiver copies the mirror into its pool
    ASSERT_EQ(kv_stage_in(sd, theirs + 1, 3), 0);
  }
  const mdl_kv *kvp = kv_pool_kv(pp), *kvd = kv_pool_kv(pd);
  size_t chunk = mdl_kv_chunk_bytes(&cfg, kvp);
  std::vector<uint8_t> zero(chunk, 0);
  for (int l = 0; l < cfg.n_layer; l++) {
    for (int b = 0; b < 3; b++)
      EXPECT_EQ(
          std::memcmp(mdl_kv_chunk(&cfg, kvd, l, 0, theirs[b + 1]), mdl_kv_chunk(&cfg, kvp, l, 0, mine[b]), chunk), 0)
          << "layer " << l << " block " << b;
    EXPECT_EQ(std::memcmp(mdl_kv_chunk(&cfg, kvd, l, 0, theirs[0]), zero.data(), chunk), 0) << "untouched, layer " << l;
  }
  if (sd) {
    EXPECT_DOUBLE_EQ(kv_stage_bytes_in(sd), 3.0 * cfg.n_layer * chunk);
  }
  kvx_deregister(ap, rp);
  kvx_deregister(ad, rd);
  kv_stage_free(sp);
  kv_stage_free(sd);
  kvx_agent_free(ap);
  kvx_agent_free(ad);
  kv_pool_free(pp);
  kv_pool_free(pd);
}

INSTANTIATE_TEST_SUITE_P(Backends, LatentPush,
                         ::testing::Values(std::make_tuple("tcp", KRN_F16, false),
                                           std::make_tuple("shm", KRN_Q8_0, false),
                                           std::make_tuple("tcp", KRN_Q8_0, true)),
                         [](const auto &i) {
                           return std::string(std::get<0>(i.param)) + "_" + krn_kv_type_str(std::get<1>(i.param)) +
                                  (std::get<2>(i.param) ? "_staged" : "");
                         });

} // namespace
