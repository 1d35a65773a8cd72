// config/config_int.h: what config.c shares with the other files of config/ (not for other modules).
#ifndef DSERVE_CFG_CONFIG_INT_H
#define DSERVE_CFG_CONFIG_INT_H

#include <stddef.h>

// The whole file at path (at most 64 MiB) in *text (malloc'd, NUL-terminated), its length in *len; -1 with err
// ("PATH: why") otherwise.
int cfg_read_text(const char *path, char **text, size_t *len, char *err, size_t errlen);

#endif
