// anvil <command> [flags]: generate, chat, export, logits, score, tokenize, prepare
// (anvil::tool::anvil_main, in the library, is the whole program).
#include "anvil/tool/tool.h"

int main(int argc, char** argv) { return anvil::tool::anvil_main(argc, argv); }
