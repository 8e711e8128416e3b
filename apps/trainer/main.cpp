// trainer --config a.yaml [--config b.yaml ...] [key.path=value ...]
// (anvil::train::trainer_main, in the library, is the whole program.)
#include "anvil/train/trainer.h"

int main(int argc, char** argv) { return anvil::train::trainer_main(argc, argv); }
