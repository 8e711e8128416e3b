#pragma once
// The anvil tool's entry: generate, chat, export, logits, score, tokenize and
// prepare, the whole program (as train::trainer_main is the trainer's), so
// that a program linking libanvil can offer the same commands.

namespace anvil::tool {

/// Parses `anvil <command> [flags]` and runs it; returns the exit status (a
/// bad flag or input is reported on stderr, naming the flag, file or line).
int anvil_main(int argc, char** argv);

}  // namespace anvil::tool
