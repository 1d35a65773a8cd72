// tests/models/grammar_util.h: what the grammar tests share: a schema compiled into a grammar, and whole-text checks.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <string>

extern "C" {
#include "models/grammar.h"
}

struct Grammar {
  mdl_grammar *g = nullptr;
  int rc = 0;
  char err[512] = "";
  explicit Grammar(const char *schema) {
    rc = mdl_grammar_from_json_schema(schema, schema ? strlen(schema) : 0, &g, err, sizeof err);
  }
  ~Grammar() { mdl_grammar_unref(g); }
  bool ok(const std::string &text) const { return g && mdl_grammar_matches(g, text.data(), text.size()); }
};

#define EXPECT_ACCEPTS(G, T) EXPECT_TRUE((G).ok(T)) << "should accept: " << (T)
#define EXPECT_REJECTS(G, T) EXPECT_FALSE((G).ok(T)) << "should reject: " << (T)
