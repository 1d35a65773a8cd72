// spec/draft.c: proposing drafts: prompt lookup in the sequence itself and the suffix index over recent outputs.
#include "spec/spec.h"
