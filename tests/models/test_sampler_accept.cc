// tests/models/test_sampler_accept.cc: a token sampled elsewhere and accepted leaves the sampler where sampling it would.
#include <gtest/gtest.h>

#include <vector>

#include "models/sampler.h"

TEST(SamplerAccept, AcceptThenSampleEqualsSampleThenSample) {
  const int V = 50;
  std::vector<float> logits(V);
  for (int i = 0; i < V; i++) logits[i] = (float)((i * 37) % 11) * 0.3f;
  mdl_sampling sp = {};
  sp.temperature = 0.9f;
  sp.top_p = 1.0f;
  sp.repetition_penalty = 1.3f;
  sp.frequency_penalty = 0.5f;
  sp.seed = 1234;
  int32_t prompt[] = {1, 2, 3};
  char err[128];
  mdl_sampler *a = nullptr, *b = nullptr;
  ASSERT_EQ(mdl_sampler_new(&sp, V, prompt, 3, &a, err, sizeof err), 0) << err;
  ASSERT_EQ(mdl_sampler_new(&sp, V, prompt, 3, &b, err, sizeof err), 0) << err;
  mdl_sampled first;
  mdl_sampler_sample(a, logits.data(), &first);
  mdl_sampler_accept(b, first.token); // b did not see the logits: another process sampled for it
  for (int step = 0; step < 20; step++) {
    mdl_sampled x, y;
    mdl_sampler_sample(a, logits.data(), &x);
    mdl_sampler_sample(b, logits.data(), &y);
    ASSERT_EQ(x.token, y.token) << "step " << step;
  }
  mdl_sampler_free(a);
  mdl_sampler_free(b);
}
