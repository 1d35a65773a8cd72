// tests/spec/test_spec.cc: the drafts (prompt lookup, the suffix index, against a naive reference) and draft lengths.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

extern "C" {
#include "spec/spec.h"
}

namespace {

using Toks = std::vector<int32_t>;

Toks propose(const spc_index *ix, const Toks &t, int k) {
  Toks d(k > 0 ? k : 1, -7);
  int m = spc_propose(ix, t.data(), (int)t.size(), k, d.data());
  EXPECT_GE(m, 0);
  EXPECT_LE(m, k > 0 ? k : 0);
  d.resize(m);
  return d;
}

spc_cfg cfg(size_t bytes, int lo = SPC_DEF_NGRAM_MIN, int hi = SPC_DEF_NGRAM_MAX) {
  spc_cfg c;
  spc_cfg_default(&c);
  c.index_bytes = bytes;
  c.ngram_min = lo;
  c.ngram_max = hi;
  return c;
}

struct Index {
  spc_index *ix = nullptr;
  explicit Index(const spc_cfg &c) {
    char err[256] = "";
    EXPECT_EQ(spc_index_new(&c, &ix, err, sizeof err), 0) << err;
  }
  ~Index() { spc_index_free(ix); }
  void add(const Toks &t) { spc_index_add(ix, t.data(), (int)t.size()); }
};

// The naive references: try every length from the longest, every earlier position from the most recent.
int suffix_match(const Toks &hay, int end_excl, const Toks &t, int len) {
  // the largest start i (i + len < end_excl: something follows) with hay[i..i+len) == t's last len tokens, or -1
  for (int i = end_excl - len - 1; i >= 0; i--)
    if (std::equal(t.end() - len, t.end(), hay.begin() + i))
      return i;
  return -1;
}

Toks naive(const std::vector<Toks> &docs, const Toks &t, int k, int lo, int hi) {
  int n = (int)t.size();
  int best = 0;
  Toks pl;
  for (int len = std::min(hi, n - 1); len >= lo && best == 0; len--) {
    int i = suffix_match(t, n, t, len); // an occurrence ending before the last token
    if (i >= 0) {
      best = len;
      for (int j = i + len; j < n && (int)pl.size() < k; j++)
        pl.push_back(t[j]);
    }
  }
  for (int len = std::min(hi, n); len >= lo && len > best; len--) {
    for (int d = (int)docs.size() - 1; d >= 0; d--) {
      int i = suffix_match(docs[d], (int)docs[d].size(), t, len);
      if (i >= 0) {
        Toks out;
        for (int j = i + len; j < (int)docs[d].size() && (int)out.size() < k; j++)
          out.push_back(docs[d][j]);
        return out;
      }
    }
  }
  return pl;
}

TEST(SpecLookup, FindsARepeatAndProposesWhatFollowedIt) {
  EXPECT_EQ(propose(nullptr, {1, 2, 3, 4, 5, 9, 9, 1, 2, 3}, 3), (Toks{4, 5, 9}));
  EXPECT_EQ(propose(nullptr, {1, 2, 3, 4, 5, 9, 9, 1, 2, 3}, 1), (Toks{4}));
  EXPECT_EQ(propose(nullptr, {1, 2, 3, 4, 5, 6}, 4), Toks{}); // nothing repeats
}

TEST(SpecLookup, NeverProposesPastTheEnd) {
  // "7 8" occurred at 0; what followed it runs to the end of toks and no further.
  EXPECT_EQ(propose(nullptr, {7, 8, 7, 8}, 10), (Toks{7, 8}));
  EXPECT_EQ(propose(nullptr, {5, 6, 1, 5, 6}, 10), (Toks{1, 5, 6}));
}

TEST(SpecLookup, LongestMatchWinsThenTheMostRecent) {
  // "1 2 3" (3 long) at the start beats the more recent "2 3" (2 long).
  EXPECT_EQ(propose(nullptr, {1, 2, 3, 40, 5, 2, 3, 50, 1, 2, 3}, 1), (Toks{40}));
  // Equal lengths: the most recent.
  EXPECT_EQ(propose(nullptr, {2, 3, 40, 2, 3, 50, 2, 3}, 1), (Toks{50}));
}

TEST(SpecLookup, BadInputProposesNothing) {
  Toks t{1, 2, 1, 2};
  int32_t d[4] = {-7, -7, -7, -7};
  EXPECT_EQ(spc_propose(nullptr, t.data(), 4, 0, d), 0);
  EXPECT_EQ(spc_propose(nullptr, t.data(), 4, -3, d), 0);
  EXPECT_EQ(spc_propose(nullptr, t.data(), 0, 4, d), 0);
  EXPECT_EQ(spc_propose(nullptr, t.data(), -5, 4, d), 0);
  EXPECT_EQ(spc_propose(nullptr, nullptr, 4, 4, d), 0);
  EXPECT_EQ(spc_propose(nullptr, t.data(), 4, 4, nullptr), 0);
  EXPECT_EQ(spc_propose(nullptr, t.data(), 1, 4, d), 0); // one token: nothing earlier
  EXPECT_EQ(d[0], -7);                                   // and nothing written
  // Shorter than ngram_min (2): a repeated single token proposes nothing, unless ngram_min is 1.
  EXPECT_EQ(propose(nullptr, {1, 2, 1}, 2), Toks{});
  Index one(cfg(SPC_INDEX_MIN_BYTES, 1, 3));
  EXPECT_EQ(propose(one.ix, {1, 2, 1}, 2), (Toks{2, 1}));
  // A negative id is a boundary: it matches nothing.
  EXPECT_EQ(propose(nullptr, {-1, 4, 5, -1}, 2), Toks{});
}

TEST(SpecConfig, ChecksNameTheField) {
  char err[256];
  spc_cfg c = cfg(SPC_DEF_INDEX_BYTES);
  EXPECT_EQ(spc_cfg_check(&c, err, sizeof err), 0);
  struct Bad {
    void (*set)(spc_cfg *);
    const char *field;
  } bad[] = {{[](spc_cfg *x) { x->k_max = 0; }, "k_max"},
             {[](spc_cfg *x) { x->k_max = SPC_K_LIMIT + 1; }, "k_max"},
             {[](spc_cfg *x) { x->ngram_min = 0; }, "ngram_min"},
             {[](spc_cfg *x) { x->ngram_min = x->ngram_max + 1; }, "ngram_min"},
             {[](spc_cfg *x) { x->ngram_max = SPC_NGRAM_LIMIT + 1; }, "ngram_max"},
             {[](spc_cfg *x) { x->index_bytes = 100; }, "index_bytes"}};
  for (const Bad &b : bad) {
    spc_cfg x = c;
    b.set(&x);
    err[0] = 0;
    EXPECT_EQ(spc_cfg_check(&x, err, sizeof err), -1) << b.field;
    EXPECT_NE(std::string(err).find(b.field), std::string::npos) << err;
    spc_index *ix = (spc_index *)1;
    EXPECT_EQ(spc_index_new(&x, &ix, err, sizeof err), -1);
    EXPECT_EQ(ix, nullptr);
  }
  spc_cfg_default(&c);
  EXPECT_EQ(c.k_max, SPC_DEF_K_MAX);
  EXPECT_EQ(c.index_bytes, SPC_DEF_INDEX_BYTES);
}

TEST(SpecIndex, ProposesFromRecentOutputsWithinOneDocument) {
  Index ix(cfg(SPC_INDEX_MIN_BYTES));
  ix.add({10, 11, 12, 13, 14});
  ix.add({50, 51});
  EXPECT_EQ(propose(ix.ix, {99, 11, 12}, 2), (Toks{13, 14}));
  // The draft stops at the document's end, never running into the next one.
  EXPECT_EQ(propose(ix.ix, {99, 12, 13}, 5), (Toks{14}));
  EXPECT_EQ(propose(ix.ix, {99, 13, 14}, 5), Toks{});
  // The most recent document wins among equal matches.
  ix.add({11, 12, 77});
  EXPECT_EQ(propose(ix.ix, {99, 11, 12}, 2), (Toks{77}));
  // No index: nothing from it.
  EXPECT_EQ(propose(nullptr, {99, 11, 12}, 2), Toks{});
}

TEST(SpecIndex, ALongerMatchBeatsThePromptsAndEqualOnesLoseToIt) {
  Index ix(cfg(SPC_INDEX_MIN_BYTES));
  ix.add({1, 2, 3, 4, 60});
  // The prompt has "3 4" (2 long) followed by 70; the index has "2 3 4" (3 long) followed by 60.
  EXPECT_EQ(propose(ix.ix, {3, 4, 70, 2, 3, 4}, 1), (Toks{60}));
  // Equal lengths ("3 4" in both, since the prompt lacks "2 3 4"): the prompt's.
  EXPECT_EQ(propose(ix.ix, {3, 4, 70, 9, 3, 4}, 1), (Toks{70}));
}

TEST(SpecIndex, MemoryStaysBoundedAfterManyAdds) {
  for (size_t bytes : {(size_t)SPC_INDEX_MIN_BYTES, (size_t)1 << 20}) {
    Index ix(cfg(bytes));
    size_t before = spc_index_bytes(ix.ix);
    EXPECT_LE(before, bytes);
    EXPECT_GT(before, bytes / 2); // and it uses its budget
    std::mt19937 rng(7);
    for (int d = 0; d < 5000; d++) {
      Toks t(1 + rng() % 400);
      for (auto &x : t)
        x = (int32_t)(rng() % 1000);
      ix.add(t);
    }
    EXPECT_EQ(spc_index_bytes(ix.ix), before);
    Index none(cfg(0));
    EXPECT_LE(spc_index_bytes(none.ix), (size_t)1024);
    none.add({1, 2, 3}); // no ring: nothing kept, nothing proposed
    EXPECT_EQ(propose(none.ix, {9, 1, 2}, 2), Toks{});
  }
}

TEST(SpecIndex, EvictsTheOldestDocumentsFirst) {
  Index ix(cfg(SPC_INDEX_MIN_BYTES));
  // Documents of 500 distinct tokens each (ids 1000*d + i); the ring holds about two thousand tokens.
  auto doc = [](int d) {
    Toks t(500);
    for (int i = 0; i < 500; i++)
      t[i] = 1000 * d + i;
    return t;
  };
  // How many of document d's 2-grams still propose what followed them.
  auto found = [&](int d) {
    int f = 0;
    for (int i = 0; i + 2 < 500; i++)
      f += propose(ix.ix, {7, 1000 * d + i, 1000 * d + i + 1}, 1) == Toks{1000 * d + i + 2};
    return f;
  };
  int d = 0;
  ix.add(doc(d++));
  EXPECT_EQ(found(0), 498);
  // Add until the first document is gone from the ring.
  while (found(0) > 0 && d < 100)
    ix.add(doc(d++));
  ASSERT_GE(d, 3);
  ASSERT_LT(d, 100);
  // The next oldest go next; the newest are all there.
  int prev = 0;
  for (int e = 1; e < d; e++) {
    int f = found(e);
    EXPECT_GE(f, prev) << "document " << e << " of " << d;
    prev = f;
  }
  EXPECT_EQ(found(d - 1), 498);
  EXPECT_GE(found(d - 2), 490); // a full bucket may have dropped a few (the table forgets by bucket, not exactly)
  // A document longer than the whole ring keeps its end.
  Toks big(100000);
  for (int i = 0; i < (int)big.size(); i++)
    big[i] = 500000 + i;
  ix.add(big);
  EXPECT_EQ(propose(ix.ix, {99, 599990, 599991}, 2), (Toks{599992, 599993}));
  EXPECT_EQ(propose(ix.ix, {99, 500010, 500011}, 2), Toks{});
  EXPECT_EQ(found(d - 1), 0);
}

TEST(SpecLookup, RandomizedAgainstANaiveReference) {
  std::mt19937 rng(42);
  int proposed = 0, from_index = 0;
  for (int it = 0; it < 4000; it++) {
    int lo = 1 + (int)(rng() % 3), hi = lo + (int)(rng() % 4);
    Index ix(cfg(SPC_DEF_INDEX_BYTES, lo, hi));
    const bool use_ix = it % 2 == 1;
    int alpha = 2 + (int)(rng() % 6);
    std::vector<Toks> docs;
    if (use_ix) {
      for (int d = (int)(rng() % 4); d > 0; d--) {
        Toks t(1 + rng() % 30);
        for (auto &x : t)
          x = (int32_t)(rng() % alpha);
        docs.push_back(t);
        ix.add(t);
      }
    }
    Toks t(1 + rng() % 60);
    for (auto &x : t)
      x = (int32_t)(rng() % alpha);
    int k = 1 + (int)(rng() % 10);
    Toks want = naive(docs, t, k, use_ix ? lo : SPC_DEF_NGRAM_MIN, use_ix ? hi : SPC_DEF_NGRAM_MAX);
    Toks got = propose(use_ix ? ix.ix : nullptr, t, k);
    ASSERT_EQ(got, want) << "iteration " << it;
    proposed += !got.empty();
    from_index += use_ix && !got.empty() && got != naive({}, t, k, lo, hi);
  }
  EXPECT_GT(proposed, 1000); // the cases exercise both paths
  EXPECT_GT(from_index, 100);
}

TEST(SpecSeq, DraftLengthFollowsAcceptance) {
  spc_cfg c = cfg(0);
  spc_seq s;
  spc_seq_init(&s, &c);
  EXPECT_EQ(spc_want(&s, 100), 4);
  EXPECT_EQ(spc_want(&s, 2), 2); // the scheduler's cap
  EXPECT_EQ(spc_want(&s, 0), 0);
  EXPECT_EQ(spc_want(&s, -1), 0);
  spc_seq_update(&s, 4, 4); // whole: doubles, up to k_max
  EXPECT_EQ(spc_want(&s, 100), 8);
  spc_seq_update(&s, 8, 8);
  EXPECT_EQ(spc_want(&s, 100), SPC_DEF_K_MAX);
  spc_seq_update(&s, 8, 1); // partial: shorter
  int k = spc_want(&s, 100);
  EXPECT_GE(k, 1);
  EXPECT_LT(k, 8);
  spc_seq_update(&s, 0, 0); // a step without a draft changes nothing while on
  EXPECT_EQ(spc_want(&s, 100), k);
  EXPECT_EQ(s.drafts, 3);
  EXPECT_EQ(s.drafted, 20);
  EXPECT_EQ(s.accepted, 13);
  spc_seq_update(&s, 3, 9); // clamped to what was drafted
  EXPECT_EQ(s.accepted, 16);
}

TEST(SpecSeq, StopsAfterFailuresAndProbesNowAndThen) {
  spc_cfg c = cfg(0);
  spc_seq s;
  spc_seq_init(&s, &c);
  for (int i = 0; i < SPC_OFF_AFTER - 1; i++) {
    spc_seq_update(&s, spc_want(&s, 100), 0);
    EXPECT_GE(spc_want(&s, 100), 1) << i; // not yet
  }
  spc_seq_update(&s, spc_want(&s, 100), 0);
  EXPECT_EQ(spc_want(&s, 100), 0); // off
  // A probe after SPC_PROBE_MIN_STEPS steps without a draft; failed probes space out (doubling).
  int interval = SPC_PROBE_MIN_STEPS;
  for (int round = 0; round < 3; round++) {
    for (int i = 0; i < interval; i++) {
      EXPECT_EQ(spc_want(&s, 100), 0) << round << " " << i;
      spc_seq_update(&s, 0, 0);
    }
    EXPECT_EQ(spc_want(&s, 100), SPC_PROBE_K) << round;
    EXPECT_EQ(spc_want(&s, 1), 1); // capped too
    spc_seq_update(&s, SPC_PROBE_K, 0);
    EXPECT_EQ(spc_want(&s, 100), 0);
    interval *= 2;
  }
  // The interval stops doubling at SPC_PROBE_MAX_STEPS.
  for (int round = 0; round < 8; round++) {
    for (int i = 0; i < SPC_PROBE_MAX_STEPS && spc_want(&s, 100) == 0; i++)
      spc_seq_update(&s, 0, 0);
    ASSERT_EQ(spc_want(&s, 100), SPC_PROBE_K) << round;
    spc_seq_update(&s, SPC_PROBE_K, 0);
  }
  // A probe that holds turns drafting back on, and the next failure streak starts from the shortest interval.
  for (int i = 0; i < SPC_PROBE_MAX_STEPS && spc_want(&s, 100) == 0; i++)
    spc_seq_update(&s, 0, 0);
  spc_seq_update(&s, SPC_PROBE_K, SPC_PROBE_K);
  EXPECT_GE(spc_want(&s, 100), SPC_PROBE_K);
  for (int i = 0; i < SPC_OFF_AFTER; i++)
    spc_seq_update(&s, spc_want(&s, 100), 0);
  EXPECT_EQ(spc_want(&s, 100), 0);
  for (int i = 0; i < SPC_PROBE_MIN_STEPS; i++)
    spc_seq_update(&s, 0, 0);
  EXPECT_EQ(spc_want(&s, 100), SPC_PROBE_K);
}

} // namespace
