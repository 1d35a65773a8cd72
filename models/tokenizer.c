// models/tokenizer.c: loading (GPT-2 byte-level BPE and SentencePiece vocabularies), special tokens, and the BPE
// encoder with the smollm, llama-bpe (Llama 3) and qwen2 (Qwen 2.5) pre-tokenizers (SentencePiece encoding: tok_spm.c; decoding: tok_decode.c).
#include "models/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/tok_int.h"
#include "models/tok_unicode.h"
#include "util/err.h"

// ---- load ----

void mdl_tok_free(mdl_tok *t) {
  if (!t) return;
  free(t->text);
  free(t->text_off);
  free(t->text_len);
  free(t->piece);
  free(t->piece_off);
  free(t->piece_len);
  free(t->type);
  free(t->hmap);
  free(t->mmap);
  free(t->special);
  free(t->score);
  free(t);
}

static int cmp_special_len(const void *a, const void *b, void *ctx) {
  const mdl_tok *t = ctx;
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  if (t->text_len[x] != t->text_len[y]) return t->text_len[x] > t->text_len[y] ? -1 : 1;
  return x < y ? -1 : x > y;
}

static int get_opt_id(const mdl_gguf *g, const mdl_tok *t, const char *key, int32_t *out, char *err, size_t errlen) {
  int64_t v;
  *out = -1;
  if (!mdl_gguf_find(g, key)) return 0;
  if (mdl_gguf_get_i64(g, key, &v) != 0) {
    utl_seterr(err, errlen, "%s is not an integer", key);
    return -1;
  }
  if (v < 0 || v >= t->n_vocab) {
    // llama.cpp treats out-of-range special ids as absent too; say so instead of using them
    *out = -1;
    return 0;
  }
  *out = (int32_t)v;
  return 0;
}

int mdl_tok_load(const mdl_gguf *g, mdl_tok **out, char *err, size_t errlen) {
  *out = NULL;
  mdl_str s;
  if (mdl_gguf_get_str(g, "tokenizer.ggml.model", &s) != 0) {
    utl_seterr(err, errlen, "tokenizer.ggml.model is missing");
    return -1;
  }
  const int spm = mdl_str_eq(s, "llama");
  if (!mdl_str_eq(s, "gpt2") && !spm) {
    utl_seterr(err, errlen, "tokenizer.ggml.model '%.*s' is not supported (gpt2 byte-level BPE and llama SentencePiece are)",
               (int)(s.n > 64 ? 64 : s.n), s.p);
    return -1;
  }
  int pre = MDL_PRE_GPT2;
  if (spm) {
    if (mdl_gguf_get_str(g, "tokenizer.ggml.pre", &s) == 0 && !mdl_str_eq(s, "default")) {
      utl_seterr(err, errlen, "tokenizer.ggml.pre '%.*s' is not supported with a SentencePiece vocabulary (default is)",
                 (int)(s.n > 64 ? 64 : s.n), s.p);
      return -1;
    }
  } else if (mdl_gguf_get_str(g, "tokenizer.ggml.pre", &s) == 0) {
    // the names llama.cpp maps to these pre-tokenizers (src/llama-vocab.cpp)
    if (mdl_str_eq(s, "smollm") || mdl_str_eq(s, "starcoder") || mdl_str_eq(s, "refact")) pre = MDL_PRE_SMOLLM;
    else if (mdl_str_eq(s, "llama-bpe") || mdl_str_eq(s, "llama3") || mdl_str_eq(s, "llama-v3")) pre = MDL_PRE_LLAMA3;
    else if (mdl_str_eq(s, "qwen2") || mdl_str_eq(s, "deepseek-r1-qwen")) pre = MDL_PRE_QWEN2;
    else if (!mdl_str_eq(s, "gpt2") && !mdl_str_eq(s, "default")) {
      utl_seterr(err, errlen,
                 "tokenizer.ggml.pre '%.*s' is not supported (smollm, llama-bpe, qwen2, gpt2 and default are, with "
                 "the other names llama.cpp gives the same pre-tokenizers: starcoder, refact, llama3, llama-v3, "
                 "deepseek-r1-qwen)",
                 (int)(s.n > 64 ? 64 : s.n), s.p);
      return -1;
    }
  }
  const mdl_gguf_kv *toks = mdl_gguf_find(g, "tokenizer.ggml.tokens");
  if (!toks || toks->type != MDL_GGUF_ARR || toks->arr_type != MDL_GGUF_STR) {
    utl_seterr(err, errlen, "tokenizer.ggml.tokens is missing or not an array of strings");
    return -1;
  }
  if (toks->arr_n == 0 || toks->arr_n > (1u << 24)) {
    utl_seterr(err, errlen, "tokenizer.ggml.tokens has %llu entries (1 to %u accepted)", (unsigned long long)toks->arr_n, 1u << 24);
    return -1;
  }
  const mdl_gguf_kv *types = mdl_gguf_find(g, "tokenizer.ggml.token_type");
  if (types && (types->type != MDL_GGUF_ARR || types->arr_n != toks->arr_n)) {
    utl_seterr(err, errlen, "tokenizer.ggml.token_type is not an array of %llu entries", (unsigned long long)toks->arr_n);
    return -1;
  }
  const mdl_gguf_kv *merges = mdl_gguf_find(g, "tokenizer.ggml.merges");
  const mdl_gguf_kv *scores = mdl_gguf_find(g, "tokenizer.ggml.scores");
  if (spm && (!scores || scores->type != MDL_GGUF_ARR || scores->arr_n != toks->arr_n)) {
    utl_seterr(err, errlen, "tokenizer.ggml.scores is missing or not an array of %llu entries (a SentencePiece vocabulary needs it)",
               (unsigned long long)toks->arr_n);
    return -1;
  }
  if (spm) merges = NULL; // SentencePiece merges by score
  else if (!merges || merges->type != MDL_GGUF_ARR || merges->arr_type != MDL_GGUF_STR) {
    utl_seterr(err, errlen, "tokenizer.ggml.merges is missing or not an array of strings");
    return -1;
  }
  if (merges && merges->arr_n >= (uint64_t)INT32_MAX) {
    utl_seterr(err, errlen, "tokenizer.ggml.merges has too many entries");
    return -1;
  }

  mdl_tok *t = calloc(1, sizeof *t);
  if (!t) goto oom;
  t->pre = pre;
  t->ignore_merges = pre == MDL_PRE_LLAMA3; // as llama.cpp sets it for these names
  t->spm = spm;
  int n = (int)toks->arr_n;
  t->n_vocab = n;
  size_t total = 0;
  for (int i = 0; i < n; i++) {
    if (mdl_gguf_arr_str(toks, (uint64_t)i, &s) != 0) goto bad_tok;
    if (s.n > MDL_TOK_MAX_PIECE) {
      utl_seterr(err, errlen, "token %d is %llu bytes long (at most %d accepted)", i, (unsigned long long)s.n, MDL_TOK_MAX_PIECE);
      goto fail;
    }
    total += (size_t)s.n + 1;
  }
  if (total > UINT32_MAX) goto bad_tok;
  t->text = malloc(total);
  t->piece = malloc(total);
  t->text_off = malloc((size_t)n * sizeof *t->text_off);
  t->text_len = malloc((size_t)n * sizeof *t->text_len);
  t->piece_off = malloc((size_t)n * sizeof *t->piece_off);
  t->piece_len = malloc((size_t)n * sizeof *t->piece_len);
  t->type = malloc((size_t)n);
  if (spm && !(t->score = malloc((size_t)n * sizeof *t->score))) goto oom;
  t->hcap = mdl_tok_pow2_at_least((size_t)n * 2);
  t->hmap = malloc(t->hcap * sizeof *t->hmap);
  if (!t->text || !t->piece || !t->text_off || !t->text_len || !t->piece_off || !t->piece_len || !t->type || !t->hmap) goto oom;
  memset(t->hmap, 0xff, t->hcap * sizeof *t->hmap);

  // GPT-2 byte <-> printable code point map: printable Latin-1 bytes map to themselves, the rest to 256 + k
  memset(t->cp_to_byte, 0xff, sizeof t->cp_to_byte);
  for (int b = 0, k = 0; b < 256; b++) {
    int keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    int cp = keep ? b : 256 + k++;
    t->byte_to_cp[b] = (uint16_t)cp;
    t->cp_to_byte[cp] = (int16_t)b;
  }

  size_t off = 0, poff = 0;
  for (int i = 0; i < n; i++) {
    mdl_gguf_arr_str(toks, (uint64_t)i, &s);
    memcpy(t->text + off, s.p, (size_t)s.n);
    t->text[off + s.n] = 0;
    t->text_off[i] = (uint32_t)off;
    t->text_len[i] = (uint32_t)s.n;
    off += (size_t)s.n + 1;
    int64_t ty = MDL_TOK_NORMAL;
    if (types && mdl_gguf_arr_i64(types, (uint64_t)i, &ty) != 0) {
      utl_seterr(err, errlen, "tokenizer.ggml.token_type is not an integer array");
      goto fail;
    }
    t->type[i] = (ty >= 1 && ty <= 6) ? (uint8_t)ty : MDL_TOK_NORMAL;
    mdl_tok_hmap_put(t, i);
    t->piece_off[i] = (uint32_t)poff;
    const uint8_t *p = (const uint8_t *)s.p;
    if (spm) {
      if (mdl_gguf_arr_f32(scores, (uint64_t)i, &t->score[i]) != 0) {
        utl_seterr(err, errlen, "tokenizer.ggml.scores is not a float array");
        goto fail;
      }
      // pieces as llama.cpp's token_to_piece (special = true) gives them: control/user/unknown text as it is,
      // a byte token its byte, a normal token with U+2581 back to spaces, an unused token nothing
      int ty = t->type[i];
      unsigned bv;
      if (ty == MDL_TOK_CONTROL || ty == MDL_TOK_USER || ty == MDL_TOK_UNKNOWN) {
        memcpy(t->piece + poff, p, (size_t)s.n);
        poff += (size_t)s.n;
      } else if (ty == MDL_TOK_BYTE) {
        char hex[8];
        if (s.n != 6 || memcmp(p, "<0x", 3) || p[5] != '>' || (memcpy(hex, p + 3, 2), hex[2] = 0, sscanf(hex, "%2x", &bv) != 1)) {
          utl_seterr(err, errlen, "token %d is a byte token but its text is not <0xXX>", i);
          goto fail;
        }
        t->piece[poff++] = (char)bv;
      } else if (ty == MDL_TOK_NORMAL) {
        for (size_t j = 0; j < s.n;) {
          if (j + 3 <= s.n && p[j] == 0xE2 && p[j + 1] == 0x96 && p[j + 2] == 0x81) {
            t->piece[poff++] = ' ';
            j += 3;
          } else {
            t->piece[poff++] = (char)p[j++];
          }
        }
      }
    } else if (t->type[i] == MDL_TOK_CONTROL || t->type[i] == MDL_TOK_USER) {
      memcpy(t->piece + poff, p, (size_t)s.n);
      poff += (size_t)s.n;
    } else {
      for (size_t j = 0; j < s.n;) {
        size_t j0 = j;
        uint32_t cp = mdl_tok_cp_next(p, (size_t)s.n, &j);
        if (cp < 512 && t->cp_to_byte[cp] >= 0) {
          t->piece[poff++] = (char)t->cp_to_byte[cp];
        } else {
          memcpy(t->piece + poff, p + j0, j - j0);
          poff += j - j0;
        }
      }
    }
    t->piece_len[i] = (uint32_t)(poff - t->piece_off[i]);
  }
  int n_bytes = 0;
  for (int b = 0; spm && b < 256; b++) {
    // llama.cpp's byte_to_token: the <0xXX> token, else the one-byte text
    char hx[8];
    snprintf(hx, sizeof hx, "<0x%02X>", b);
    t->byte_tok[b] = mdl_tok_find_n(t, hx, 6);
    if (t->byte_tok[b] < 0) t->byte_tok[b] = mdl_tok_find_n(t, (const char *)&(char){(char)b}, 1);
  }
  for (int b = 0; !spm && b < 256; b++) {
    uint8_t u[4];
    size_t k = mdl_tok_cp_put(u, t->byte_to_cp[b]);
    t->byte_tok[b] = mdl_tok_find_n(t, (const char *)u, k); // -1 where the vocabulary lacks it (SmolLM2 lacks a few)
    if (t->byte_tok[b] >= 0) n_bytes++;
  }
  if (!spm && n_bytes < 128) {
    utl_seterr(err, errlen, "the vocabulary has tokens for only %d of the 256 bytes (not a byte-level BPE vocabulary)", n_bytes);
    goto fail;
  }

  // merges "left right" -> rank; pairs whose parts or result are not tokens cannot fire and are left out
  if (merges && merges->arr_n > 0) {
    t->mcap = mdl_tok_pow2_at_least((size_t)merges->arr_n * 2);
    t->mmap = malloc(t->mcap * sizeof *t->mmap);
    if (!t->mmap) goto oom;
    for (size_t i = 0; i < t->mcap; i++) t->mmap[i].key = MRG_EMPTY;
    char buf[2 * MDL_TOK_MAX_PIECE + 2];
    for (uint64_t i = 0; i < merges->arr_n; i++) {
      mdl_gguf_arr_str(merges, i, &s);
      if (s.n < 3 || s.n > sizeof buf) continue;
      const char *sp = memchr(s.p + 1, ' ', (size_t)s.n - 1);
      if (!sp) continue;
      size_t ln = (size_t)(sp - s.p), rn = (size_t)s.n - ln - 1;
      int32_t l = mdl_tok_find_n(t, s.p, ln), r = mdl_tok_find_n(t, sp + 1, rn);
      if (l < 0 || r < 0) continue;
      memcpy(buf, s.p, ln);
      memcpy(buf + ln, sp + 1, rn);
      int32_t m = mdl_tok_find_n(t, buf, ln + rn);
      if (m < 0) continue;
      mdl_tok_mrg_put(t, l, r, (int32_t)i, m);
    }
  }

  // special tokens matched in text, longest first
  t->special = malloc((size_t)n * sizeof *t->special);
  if (!t->special) goto oom;
  for (int i = 0; i < n; i++)
    if ((t->type[i] == MDL_TOK_CONTROL || t->type[i] == MDL_TOK_USER || t->type[i] == MDL_TOK_UNKNOWN) && t->text_len[i] > 0)
      t->special[t->n_special++] = i;
  qsort_r(t->special, t->n_special, sizeof *t->special, cmp_special_len, t);

  if (get_opt_id(g, t, "tokenizer.ggml.bos_token_id", &t->bos, err, errlen) != 0 ||
      get_opt_id(g, t, "tokenizer.ggml.eos_token_id", &t->eos, err, errlen) != 0 ||
      get_opt_id(g, t, "tokenizer.ggml.padding_token_id", &t->pad, err, errlen) != 0 ||
      get_opt_id(g, t, "tokenizer.ggml.unknown_token_id", &t->unk, err, errlen) != 0)
    goto fail;
  const mdl_gguf_kv *ab = mdl_gguf_find(g, "tokenizer.ggml.add_bos_token");
  t->add_bos = ab && ab->type == MDL_GGUF_BOOL && ab->val[0] != 0;
  // add_space_prefix: llama.cpp's default for a SentencePiece vocabulary is on; Gemma's GGUF turns it off
  const mdl_gguf_kv *asp = mdl_gguf_find(g, "tokenizer.ggml.add_space_prefix");
  t->add_space_prefix = spm && (!asp || (asp->type == MDL_GGUF_BOOL && asp->val[0] != 0));
  // End of generation as llama.cpp's llama_vocab marks it (src/llama-vocab.cpp): eos, the GGUF's eot and eom ids, and
  // the turn-end tokens by text. A Jinja template's turns end with one of them (Llama 3.1's calls with <|eom_id|>).
  int32_t eot = -1, eom = -1;
  if (get_opt_id(g, t, "tokenizer.ggml.eot_token_id", &eot, err, errlen) != 0 ||
      get_opt_id(g, t, "tokenizer.ggml.eom_token_id", &eom, err, errlen) != 0)
    goto fail;
  static const char *const eog_texts[] = {"<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end|>",
                                           "<|end_of_text|>", "<end_of_turn>", "<EOT>", "<end_of_utterance>"};
  int32_t cand[2 + 3 + sizeof eog_texts / sizeof eog_texts[0]];
  int nc = 0;
  cand[nc++] = t->eos;
  cand[nc++] = eot;
  cand[nc++] = eom;
  for (size_t i = 0; i < sizeof eog_texts / sizeof eog_texts[0]; i++)
    cand[nc++] = mdl_tok_find_n(t, eog_texts[i], strlen(eog_texts[i]));
  for (int i = 0; i < nc; i++) {
    int seen = cand[i] < 0;
    for (int k = 0; k < t->n_eog && !seen; k++) seen = t->eog[k] == cand[i];
    if (!seen && t->n_eog < (int)(sizeof t->eog / sizeof t->eog[0])) t->eog[t->n_eog++] = cand[i];
  }
  *out = t;
  return 0;
bad_tok:
  utl_seterr(err, errlen, "tokenizer.ggml.tokens is malformed");
  goto fail;
oom:
  utl_seterr(err, errlen, "out of memory");
fail:
  mdl_tok_free(t);
  return -1;
}

// ---- accessors ----

int mdl_tok_n_vocab(const mdl_tok *t) { return t->n_vocab; }
int32_t mdl_tok_bos(const mdl_tok *t) { return t->bos; }
int32_t mdl_tok_eos(const mdl_tok *t) { return t->eos; }
int32_t mdl_tok_pad(const mdl_tok *t) { return t->pad; }
int32_t mdl_tok_unk(const mdl_tok *t) { return t->unk; }
int mdl_tok_add_bos(const mdl_tok *t) { return t->add_bos; }

int mdl_tok_is_eog(const mdl_tok *t, int32_t id) {
  for (int i = 0; i < t->n_eog; i++)
    if (t->eog[i] == id) return 1;
  return 0;
}

int mdl_tok_type(const mdl_tok *t, int32_t id) { return (id >= 0 && id < t->n_vocab) ? t->type[id] : 0; }
int mdl_tok_is_control(const mdl_tok *t, int32_t id) { return mdl_tok_type(t, id) == MDL_TOK_CONTROL; }

int32_t mdl_tok_find(const mdl_tok *t, const char *piece) { return piece ? mdl_tok_find_n(t, piece, strlen(piece)) : -1; }

size_t mdl_tok_piece(const mdl_tok *t, int32_t id, char *buf, size_t cap) {
  if (id < 0 || id >= t->n_vocab) return 0;
  size_t n = t->piece_len[id];
  if (buf && cap) memcpy(buf, t->piece + t->piece_off[id], n < cap ? n : cap);
  return n;
}

// ---- encode ----


typedef struct heap_ent { int32_t rank, pos, l, r; } heap_ent;

typedef struct enc {
  const mdl_tok *t;
  tok_ivec out;
  // scratch for one word, grown as needed
  uint8_t *bytes;
  int32_t *sym, *prev, *next;
  heap_ent *heap;
  size_t cap, hcap, hn, bytes_cap;
  uint32_t *cps; // code points of the current fragment
  size_t cps_cap;
  char *text;    // a word's token text (GPT-2 stand-ins), for ignore_merges
  size_t text_cap;
} enc;

static int heap_less(const heap_ent *a, const heap_ent *b) { return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos); }

static int heap_push(enc *e, heap_ent x) {
  if (e->hn == e->hcap) {
    size_t nc = e->hcap ? e->hcap * 2 : 64;
    heap_ent *nh = realloc(e->heap, nc * sizeof *nh);
    if (!nh) return -1;
    e->heap = nh;
    e->hcap = nc;
  }
  size_t i = e->hn++;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (!heap_less(&x, &e->heap[p])) break;
    e->heap[i] = e->heap[p];
    i = p;
  }
  e->heap[i] = x;
  return 0;
}

static heap_ent heap_pop(enc *e) {
  heap_ent top = e->heap[0], x = e->heap[--e->hn];
  size_t i = 0, n = e->hn;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= n) break;
    if (c + 1 < n && heap_less(&e->heap[c + 1], &e->heap[c])) c++;
    if (!heap_less(&e->heap[c], &x)) break;
    e->heap[i] = e->heap[c];
    i = c;
  }
  if (n) e->heap[i] = x;
  return top;
}

static int try_pair(enc *e, int32_t pos) {
  if (pos < 0) return 0;
  int32_t nx = e->next[pos];
  if (nx < 0 || e->sym[pos] < 0 || e->sym[nx] < 0) return 0;
  const mrg_slot *m = mdl_tok_mrg_find(e->t, e->sym[pos], e->sym[nx]);
  if (!m) return 0;
  heap_ent h = {m->rank, pos, e->sym[pos], e->sym[nx]};
  return heap_push(e, h);
}

// BPE over one pre-tokenized word of n bytes: lowest rank first, leftmost on ties (as llama.cpp orders its queue).
static int bpe_word(enc *e, const uint8_t *w, size_t n) {
  const mdl_tok *t = e->t;
  if (n == 0) return 0;
  if (t->ignore_merges) { // the word spelt as token text: a token of its own is taken whole (llama.cpp's rule)
    if (n * 2 > e->text_cap) {
      char *nt = realloc(e->text, n * 4);
      if (!nt) return -1;
      e->text = nt;
      e->text_cap = n * 4;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += mdl_tok_cp_put((uint8_t *)e->text + k, t->byte_to_cp[w[i]]);
    int32_t id = mdl_tok_find_n(t, e->text, k);
    if (id >= 0) return tok_ivec_push(&e->out, id);
  }
  if (n > e->cap) {
    size_t nc = n * 2;
    int32_t *s = realloc(e->sym, nc * sizeof *s);
    if (s) e->sym = s;
    int32_t *p = realloc(e->prev, nc * sizeof *p);
    if (p) e->prev = p;
    int32_t *q = realloc(e->next, nc * sizeof *q);
    if (q) e->next = q;
    if (!s || !p || !q) return -1;
    e->cap = nc;
  }
  for (size_t i = 0; i < n; i++) {
    e->sym[i] = t->byte_tok[w[i]];
    e->prev[i] = (int32_t)i - 1;
    e->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
  }
  e->hn = 0;
  for (size_t i = 0; i + 1 < n; i++)
    if (try_pair(e, (int32_t)i) != 0) return -1;
  while (e->hn > 0) {
    heap_ent h = heap_pop(e);
    int32_t nx = e->next[h.pos];
    if (e->sym[h.pos] != h.l || nx < 0 || e->sym[nx] != h.r) continue; // stale
    const mrg_slot *m = mdl_tok_mrg_find(t, h.l, h.r);
    e->sym[h.pos] = m->merged;
    e->sym[nx] = -1;
    e->next[h.pos] = e->next[nx];
    if (e->next[nx] >= 0) e->prev[e->next[nx]] = h.pos;
    if (try_pair(e, e->prev[h.pos]) != 0 || try_pair(e, h.pos) != 0) return -1;
  }
  for (int32_t i = 0; i >= 0; i = e->next[i]) {
    if (e->sym[i] >= 0) {
      if (tok_ivec_push(&e->out, e->sym[i]) != 0) return -1;
      continue;
    }
    // a byte without a token: as llama.cpp does, try each byte of its stand-in character as a one-byte token,
    // and drop it when there is none
    uint8_t u[4];
    size_t k = mdl_tok_cp_put(u, t->byte_to_cp[w[i]]);
    for (size_t j = 0; j < k; j++) {
      int32_t id = mdl_tok_find_n(t, (const char *)u + j, 1);
      if (id >= 0 && tok_ivec_push(&e->out, id) != 0) return -1;
    }
  }
  return 0;
}

// Flags of the code point at pos within [lo, hi): 0 outside; in range: 8 | letter 1 | number 2 | space 4.
static int cflags(const uint32_t *c, size_t lo, size_t hi, size_t pos) {
  if (pos < lo || pos >= hi) return 0;
  uint32_t cp = c[pos];
  return 8 | (mdl_tok_is_letter(cp) ? 1 : 0) | (mdl_tok_is_number(cp) ? 2 : 0) | (mdl_tok_is_space(cp) ? 4 : 0);
}

static int emit_word(enc *e, size_t a, size_t b) {
  // re-encode the code points (invalid input bytes are U+FFFD by now), then BPE
  size_t need = (b - a) * 4;
  if (need > e->bytes_cap) {
    uint8_t *nb = realloc(e->bytes, need * 2);
    if (!nb) return -1;
    e->bytes = nb;
    e->bytes_cap = need * 2;
  }
  size_t n = 0;
  for (size_t i = a; i < b; i++) n += mdl_tok_cp_put(e->bytes + n, e->cps[i]);
  return bpe_word(e, e->bytes, n);
}

// The whitespace run (cflags bit 4) from pos: how many code points it holds.
static size_t ws_run(const uint32_t *c, size_t lo, size_t hi, size_t pos) {
  size_t n = 0;
  while (cflags(c, lo, hi, pos + n) & 4) n++;
  return n;
}

// Where the patterns' last alternatives  \s+(?!\S)|\s+  end a match at pos, whose whitespace run is nws long: a run
// that a non-space follows leaves its last space to the next word; with no run, the one code point no alternative
// took is a word of its own.
static size_t ws_match_end(size_t pos, size_t nws, size_t hi) {
  if (nws > 1 && pos + nws < hi) return pos + nws - 1;
  return pos + (nws ? nws : 1);
}

// The GPT-2 pattern  's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+  over one chunk.
static int split_gpt2(enc *e, size_t lo, size_t hi) {
  const uint32_t *c = e->cps;
  size_t prev_end = lo;
#define ADD(end)                                               \
  do {                                                         \
    size_t end_ = (end);                                       \
    if (end_ > prev_end && emit_word(e, prev_end, end_) != 0) return -1; \
    prev_end = end_;                                           \
  } while (0)
  for (size_t pos = lo; pos < hi;) {
    uint32_t cp = c[pos];
    int fl = cflags(c, lo, hi, pos);
    if (cp == '\'' && pos + 1 < hi) {
      uint32_t n1 = c[pos + 1];
      if (n1 == 's' || n1 == 't' || n1 == 'm' || n1 == 'd') {
        ADD(pos + 2);
        pos += 2;
        continue;
      }
      if (pos + 2 < hi) {
        uint32_t n2 = c[pos + 2];
        if ((n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') || (n1 == 'l' && n2 == 'l')) {
          ADD(pos + 3);
          pos += 3;
          continue;
        }
      }
    }
    int f2 = cp == ' ' ? cflags(c, lo, hi, pos + 1) : fl;
    if (f2 & 1) {
      pos += cp == ' ';
      while (f2 & 1) f2 = cflags(c, lo, hi, ++pos);
      ADD(pos);
      continue;
    }
    if (f2 & 2) {
      pos += cp == ' ';
      while (f2 & 2) f2 = cflags(c, lo, hi, ++pos);
      ADD(pos);
      continue;
    }
    if (!(f2 & 7) && (f2 & 8)) {
      pos += cp == ' ';
      while (!(f2 & 7) && (f2 & 8)) f2 = cflags(c, lo, hi, ++pos);
      ADD(pos);
      continue;
    }
    pos = ws_match_end(pos, ws_run(c, lo, hi, pos), hi);
    ADD(pos);
  }
#undef ADD
  return 0;
}

static int is_crlf(uint32_t cp) { return cp == '\r' || cp == '\n'; }

// Llama 3's pattern (Qwen 2's with max_digits 1), over one chunk, leftmost alternative first as a regex engine takes
// them:  (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//        ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
static int split_llama3(enc *e, size_t lo, size_t hi, int max_digits) {
  const uint32_t *c = e->cps;
  size_t prev_end = lo;
#define ADD(end)                                                         \
  do {                                                                   \
    size_t end_ = (end);                                                 \
    if (end_ > prev_end && emit_word(e, prev_end, end_) != 0) return -1; \
    prev_end = end_;                                                     \
  } while (0)
#define LOWER(x) ((x) >= 'A' && (x) <= 'Z' ? (x) + 32 : (x))
  for (size_t pos = lo; pos < hi;) {
    uint32_t cp = c[pos];
    int fl = cflags(c, lo, hi, pos);
    if (cp == '\'' && pos + 1 < hi) { // contractions, either case
      uint32_t n1 = LOWER(c[pos + 1]), n2 = pos + 2 < hi ? LOWER(c[pos + 2]) : 0;
      size_t len = (n1 == 's' || n1 == 't' || n1 == 'm' || n1 == 'd') ? 2
                   : ((n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') || (n1 == 'l' && n2 == 'l')) ? 3
                                                                                                          : 0;
      if (len) {
        pos += len;
        ADD(pos);
        continue;
      }
    }
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if ((fl & 1) || (!is_crlf(cp) && !(fl & 3) && (cflags(c, lo, hi, pos + 1) & 1))) {
      pos++;
      while (cflags(c, lo, hi, pos) & 1) pos++;
      ADD(pos);
      continue;
    }
    if (fl & 2) { // \p{N}{1,max_digits}
      for (int k = 0; k < max_digits && (cflags(c, lo, hi, pos) & 2); k++) pos++;
      ADD(pos);
      continue;
    }
    // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
    int f2 = cp == ' ' ? cflags(c, lo, hi, pos + 1) : fl;
    if ((f2 & 8) && !(f2 & 7)) {
      pos += cp == ' ';
      while (((f2 = cflags(c, lo, hi, pos)) & 8) && !(f2 & 7)) pos++;
      while (pos < hi && is_crlf(c[pos])) pos++;
      ADD(pos);
      continue;
    }
    size_t nws = ws_run(c, lo, hi, pos);
    size_t last_nl = 0; // \s*[\r\n]+: the run up to its last newline
    for (size_t k = 0; k < nws; k++)
      if (is_crlf(c[pos + k])) last_nl = k + 1;
    if (last_nl) {
      pos += last_nl;
      ADD(pos);
      continue;
    }
    pos = ws_match_end(pos, nws, hi);
    ADD(pos);
  }
#undef LOWER
#undef ADD
  return 0;
}

static int encode_raw(enc *e, const uint8_t *s, size_t n) {
  if (n + 1 > e->cps_cap) {
    uint32_t *nc = realloc(e->cps, (n + 1) * sizeof *nc);
    if (!nc) return -1;
    e->cps = nc;
    e->cps_cap = n + 1;
  }
  size_t m = 0;
  for (size_t i = 0; i < n;) e->cps[m++] = mdl_tok_cp_next(s, n, &i);
  if (e->t->pre == MDL_PRE_LLAMA3 || e->t->pre == MDL_PRE_QWEN2)
    return split_llama3(e, 0, m, e->t->pre == MDL_PRE_LLAMA3 ? 3 : 1);
  if (e->t->pre != MDL_PRE_SMOLLM) return split_gpt2(e, 0, m);
  size_t start = 0;
  for (size_t i = 0; i < m; i++) {
    if (mdl_tok_is_number(e->cps[i])) {
      if (i > start && split_gpt2(e, start, i) != 0) return -1;
      if (split_gpt2(e, i, i + 1) != 0) return -1;
      start = i + 1;
    }
  }
  return start < m ? split_gpt2(e, start, m) : 0;
}

typedef struct frag { size_t off, len; int32_t id; } frag; // id >= 0: a special token; -1: raw text

// 1 when [off, off + n) overlaps a span of spans ((n_spans, 2), in order).
static int in_spans(const size_t *spans, size_t n_spans, size_t off, size_t n) {
  size_t lo = 0, hi = n_spans; // the first span that ends after off
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (spans[2 * mid] + spans[2 * mid + 1] <= off) lo = mid + 1;
    else hi = mid;
  }
  return lo < n_spans && spans[2 * lo] < off + n;
}

static int encode_spans(const mdl_tok *t, const char *text, size_t len, int parse_special, const size_t *spans,
                        size_t n_spans, int32_t **ids, size_t *n_ids, char *err, size_t errlen);

int mdl_tok_encode(const mdl_tok *t, const char *text, size_t len, int parse_special, int32_t **ids, size_t *n_ids,
                   char *err, size_t errlen) {
  return encode_spans(t, text, len, parse_special, NULL, 0, ids, n_ids, err, errlen);
}

int mdl_tok_encode_guarded(const mdl_tok *t, const char *text, size_t len, const size_t *spans, size_t n_spans,
                           int32_t **ids, size_t *n_ids, char *err, size_t errlen) {
  return encode_spans(t, text, len, 1, spans, n_spans, ids, n_ids, err, errlen);
}

static int encode_spans(const mdl_tok *t, const char *text, size_t len, int parse_special, const size_t *spans,
                        size_t n_spans, int32_t **ids, size_t *n_ids, char *err, size_t errlen) {
  *ids = NULL;
  *n_ids = 0;
  if (!text && len) {
    utl_seterr(err, errlen, "no text");
    return -1;
  }
  enc e = {0};
  e.t = t;
  frag *fr = malloc(sizeof *fr), *nf = NULL;
  size_t nfr = 1;
  int rc = -1;
  if (!fr) goto oom;
  fr[0] = (frag){0, len, -1};
  // special tokens, longest first, split every raw fragment at each occurrence
  for (size_t k = 0; k < t->n_special; k++) {
    int32_t id = t->special[k];
    if (!parse_special && t->type[id] != MDL_TOK_USER) continue;
    const char *sp = t->text + t->text_off[id];
    size_t sl = t->text_len[id];
    size_t nn = 0, ncap = nfr + 8;
    nf = malloc(ncap * sizeof *nf);
    if (!nf) goto oom;
    for (size_t i = 0; i < nfr; i++) {
      frag f = fr[i];
      size_t o = f.off, scan = f.off, end = f.off + f.len; // o: the text not yet emitted; scan: where to look
      for (;;) {
        const char *hit = (f.id < 0 && end - scan >= sl) ? memmem(text + scan, end - scan, sp, sl) : NULL;
        size_t ho = hit ? (size_t)(hit - text) : end;
        if (hit && t->type[id] != MDL_TOK_USER && in_spans(spans, n_spans, ho, sl)) { // the request's text: no markup
          scan = ho + 1;
          continue;
        }
        if (nn + 2 > ncap) {
          size_t c2 = ncap * 2;
          frag *g2 = realloc(nf, c2 * sizeof *g2);
          if (!g2) goto oom;
          nf = g2;
          ncap = c2;
        }
        if (f.id >= 0) {
          nf[nn++] = f;
          break;
        }
        if (ho > o) nf[nn++] = (frag){o, ho - o, -1};
        if (!hit) break;
        nf[nn++] = (frag){ho, sl, id};
        o = scan = ho + sl;
      }
    }
    free(fr);
    fr = nf;
    nf = NULL;
    nfr = nn;
  }
  int prev_special = 1; // spm: the text's start counts as after a special token (llama.cpp's is_prev_special)
  for (size_t i = 0; i < nfr; i++) {
    if (fr[i].id >= 0) {
      if (tok_ivec_push(&e.out, fr[i].id) != 0) goto oom;
      prev_special = 1;
    } else if (t->spm) {
      if (mdl_tok_spm_encode(t, (const uint8_t *)text + fr[i].off, fr[i].len, t->add_space_prefix && prev_special,
                             &e.out) != 0)
        goto oom;
      prev_special = 0;
    } else if (encode_raw(&e, (const uint8_t *)text + fr[i].off, fr[i].len) != 0) {
      goto oom;
    }
  }
  *ids = e.out.v;
  *n_ids = e.out.n;
  e.out.v = NULL;
  rc = 0;
  goto done;
oom:
  utl_seterr(err, errlen, "out of memory");
done:
  free(fr);
  free(nf);
  free(e.out.v);
  free(e.bytes);
  free(e.text);
  free(e.sym);
  free(e.prev);
  free(e.next);
  free(e.heap);
  free(e.cps);
  return rc;
}
