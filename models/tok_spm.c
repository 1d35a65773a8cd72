// models/tok_spm.c: SentencePiece (tokenizer.ggml.model "llama") encoding of raw text: score-ordered pair merges
// over UTF-8 characters with <0xXX> byte fallback, matching llama.cpp's llm_tokenizer_spm.
#include <stdlib.h>
#include <string.h>

#include "models/tok_int.h"

typedef struct spm_sym {
  size_t off; // start of the symbol in the escaped text
  size_t n;   // bytes; 0 once merged into its left neighbour
  int32_t prev, next;
} spm_sym;

typedef struct spm_bigram {
  float score;
  int32_t left, right;
  size_t size; // bytes of left + right when the pair was queued (a changed side makes the entry stale)
} spm_bigram;

typedef struct spm_run {
  const mdl_tok *t;
  const uint8_t *s;
  spm_sym *sym;
  spm_bigram *heap;
  size_t hn, hcap;
} spm_run;

// Higher score first; on equal scores the leftmost pair (llama.cpp's comparator).
static int before(const spm_bigram *a, const spm_bigram *b) {
  return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static int heap_push(spm_run *r, spm_bigram x) {
  if (r->hn == r->hcap) {
    size_t nc = r->hcap ? r->hcap * 2 : 64;
    spm_bigram *nh = realloc(r->heap, nc * sizeof *nh);
    if (!nh) return -1;
    r->heap = nh;
    r->hcap = nc;
  }
  size_t i = r->hn++;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (!before(&x, &r->heap[p])) break;
    r->heap[i] = r->heap[p];
    i = p;
  }
  r->heap[i] = x;
  return 0;
}

static spm_bigram heap_pop(spm_run *r) {
  spm_bigram top = r->heap[0], x = r->heap[--r->hn];
  size_t i = 0, n = r->hn;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= n) break;
    if (c + 1 < n && before(&r->heap[c + 1], &r->heap[c])) c++;
    if (!before(&r->heap[c], &x)) break;
    r->heap[i] = r->heap[c];
    i = c;
  }
  if (n) r->heap[i] = x;
  return top;
}

static int try_bigram(spm_run *r, int32_t left, int32_t right) {
  if (left < 0 || right < 0) return 0;
  size_t size = r->sym[left].n + r->sym[right].n;
  int32_t id = mdl_tok_find_n(r->t, (const char *)r->s + r->sym[left].off, size);
  if (id < 0) return 0;
  spm_bigram b = {r->t->score[id], left, right, size};
  return heap_push(r, b);
}

// Bytes of the UTF-8 character that starts with byte b, judged by its high nibble only (as llama.cpp does: a
// stray continuation byte is a character of its own, a truncated one is cut at the end of the text).
static size_t utf8_len(uint8_t b) {
  static const uint8_t lut[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return lut[b >> 4];
}

static int emit(const mdl_tok *t, const uint8_t *p, size_t n, tok_ivec *out) {
  int32_t id = mdl_tok_find_n(t, (const char *)p, n);
  if (id >= 0) return tok_ivec_push(out, id);
  for (size_t j = 0; j < n; j++) { // byte fallback; a vocabulary without the byte token gets unk (when it has one)
    int32_t b = t->byte_tok[p[j]];
    if (b < 0) b = t->unk;
    if (b >= 0 && tok_ivec_push(out, b) != 0) return -1;
  }
  return 0;
}

int mdl_tok_spm_encode(const mdl_tok *t, const uint8_t *s, size_t n, int prefix_space, tok_ivec *out) {
  // escape: every space (and the prefix one) becomes U+2581 (3 bytes)
  size_t spaces = prefix_space ? 1 : 0;
  for (size_t i = 0; i < n; i++) spaces += s[i] == ' ';
  size_t m = n + (prefix_space ? 1 : 0) + 2 * spaces;
  if (m == 0) return 0;
  uint8_t *buf = malloc(m);
  spm_sym *sym = malloc(m * sizeof *sym);
  spm_run r = {t, buf, sym, NULL, 0, 0};
  int rc = -1;
  if (!buf || !sym) goto done;
  size_t w = 0;
  static const uint8_t lower_block[3] = {0xE2, 0x96, 0x81};
  if (prefix_space) {
    memcpy(buf, lower_block, 3);
    w = 3;
  }
  for (size_t i = 0; i < n; i++) {
    if (s[i] == ' ') {
      memcpy(buf + w, lower_block, 3);
      w += 3;
    } else {
      buf[w++] = s[i];
    }
  }
  int32_t ns = 0;
  for (size_t o = 0; o < w; ns++) {
    size_t len = utf8_len(buf[o]);
    if (len > w - o) len = w - o;
    sym[ns] = (spm_sym){o, len, ns - 1, o + len == w ? -1 : ns + 1};
    o += len;
  }
  for (int32_t i = 1; i < ns; i++)
    if (try_bigram(&r, i - 1, i) != 0) goto done;
  while (r.hn > 0) {
    spm_bigram b = heap_pop(&r);
    spm_sym *L = &sym[b.left], *R = &sym[b.right];
    if (L->n == 0 || R->n == 0 || L->n + R->n != b.size) continue; // a side merged since: stale
    L->n += R->n;
    R->n = 0;
    L->next = R->next;
    if (R->next >= 0) sym[R->next].prev = b.left;
    if (try_bigram(&r, L->prev, b.left) != 0 || try_bigram(&r, b.left, L->next) != 0) goto done;
  }
  // A merged symbol is a token by construction; only single characters that are not tokens fall back to bytes.
  for (int32_t i = 0; i >= 0; i = sym[i].next)
    if (emit(t, buf + sym[i].off, sym[i].n, out) != 0) goto done;
  rc = 0;
done:
  free(buf);
  free(sym);
  free(r.heap);
  return rc;
}
