// tests/fuzz/fuzz_chat.c: libFuzzer target: mdl_chat_apply with messages cut from the input (roles and contents).
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "models/chat.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

// Input: byte 0 = flags (bit 0 add_generation_prompt), then messages separated by 0xFF; in each message the first
// byte picks the role (0..3 system/user/assistant/""; otherwise the role is the text up to the first ':'), the rest
// is the content (NULs cut it short, as a C string would).
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0) return 0;
  int add_gen = data[0] & 1;
  char *copy = malloc(size + 1);
  if (!copy) return 0;
  memcpy(copy, data + 1, size - 1);
  copy[size - 1] = 0;
  size_t n = size - 1;
  enum { MAXM = 64 };
  mdl_chat_msg msgs[MAXM];
  static const char *const roles[] = {"system", "user", "assistant", ""};
  size_t nm = 0, start = 0;
  for (size_t i = 0; i <= n && nm < MAXM; i++) {
    if (i < n && (uint8_t)copy[i] != 0xFF) continue;
    copy[i] = 0;
    char *m = copy + start;
    size_t mlen = i - start;
    start = i + 1;
    if (mlen == 0) continue;
    uint8_t sel = (uint8_t)m[0];
    if (sel < 4) {
      msgs[nm].role = roles[sel];
      msgs[nm].content = m + 1;
    } else {
      char *colon = memchr(m, ':', mlen);
      if (colon) *colon = 0;
      msgs[nm].role = m;
      msgs[nm].content = colon ? colon + 1 : "";
    }
    nm++;
  }
  char *out = NULL, err[256];
  if (mdl_chat_apply(NULL, msgs, nm, add_gen, &out, err, sizeof err) == 0) {
    if (!out) abort();
    // Every message's content is in the rendering.
    for (size_t i = 0; i < nm; i++)
      if (!strstr(out, msgs[i].content)) abort();
    free(out);
  } else if (out != NULL) {
    abort();
  }
  char *def = NULL;
  if (mdl_chat_default_system(NULL, &def, err, sizeof err) == 0) free(def);
  free(copy);
  return 0;
}
