// models/chat.h: the ChatML chat template (as SmolLM2's GGUF tokenizer.chat_template renders it).
#ifndef DSERVE_MDL_CHAT_H
#define DSERVE_MDL_CHAT_H

#include <stddef.h>

#include "models/gguf.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mdl_chat_msg {
  const char *role;    // "system", "user" or "assistant"
  const char *content; // UTF-8, NUL-terminated
} mdl_chat_msg;

// Renders msgs (n) as ChatML: "<|im_start|>ROLE\nCONTENT<|im_end|>\n" each, then "<|im_start|>assistant\n" when
// add_generation_prompt. When the first message is not a system message and the model's template has a default system
// prompt (SmolLM2's does), that system block comes first. g may be NULL (SmolLM2's template is assumed); with a g whose
// tokenizer.chat_template is not ChatML, this fails. *out is malloc'ed (NUL-terminated); the caller frees it.
// The text is meant to be encoded with parse_special = 1.
int mdl_chat_apply(const mdl_gguf *g, const mdl_chat_msg *msgs, size_t n, int add_generation_prompt, char **out,
                   char *err, size_t errlen);

// The default system prompt the template inserts (malloc'ed into *out, NULL when the template has none).
int mdl_chat_default_system(const mdl_gguf *g, char **out, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
