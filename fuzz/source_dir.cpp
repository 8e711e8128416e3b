// The checkout's absolute path, for the targets that read its data files.

#include "fuzz_util.h"

const char* anvil::fuzz::source_dir() { return ANVIL_SOURCE_DIR; }
