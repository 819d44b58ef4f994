#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "preinit.h"
#include "system.h"

#include <torch/torch.h>

#include <thread>

int main(int argc, char** argv) {
    hs::tune_allocator();
    // Tests run with the same thread count as the tool's default: every core.
    torch::set_num_threads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
    doctest::Context ctx;
    ctx.applyCommandLine(argc, argv);
    return ctx.run();
}
