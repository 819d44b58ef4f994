// Process set-up that must happen before any shared library initialises. Include this header in
// exactly one translation unit of an executable (the one with main()).
//
// Why: libtorch's intra-op pool is OpenMP (libgomp), and Debian's OpenBLAS runs its own pthread
// pool for matrix products. With libgomp's default wait policy, idle OpenMP workers spin after
// every parallel region, and on a small machine they and OpenBLAS's threads fight over the same
// cores: a GPT-2-small-shaped forward ran at about half speed on the 2-core test machine, with
// 2.4x the CPU time (docs/performance.md, "Threads"). OMP_WAIT_POLICY=PASSIVE fixes it, but
// libgomp reads the variable once, in its own constructor, before main() runs.
//
// OpenBLAS's idle pthread workers likewise spin with sched_yield for 2^28 cycles (~0.1 s) after
// each product, across the element-wise ops libtorch runs in between; OPENBLAS_THREAD_TIMEOUT=16
// (read once, at OpenBLAS's initialisation) lets them sleep after 2^16 cycles (~30 us).
//
// How: a function in the executable's .preinit_array runs before every shared library's
// constructor, but setenv() there is undone by libc's own initialisation (it resets `environ` to
// the array the kernel passed). So the preinit function lends harmless slots of that array (`_`,
// which the shell sets to the command's path, SHLVL, OLDPWD) to the two settings, and a
// constructor of the executable, which runs after every library's, gives the slots back. The
// environment main() sees is the one the user passed, byte for byte. The user's own settings
// always win (OMP_WAIT_POLICY=ACTIVE restores libgomp's default); without spare variables
// (`env -i`), nothing changes.
#pragma once

#include <unistd.h>

#include <cstring>

namespace hs::detail {

// What is set, in order of importance: each takes the next spare slot, unless the user set it.
inline char g_env_omp[] = "OMP_WAIT_POLICY=PASSIVE";
inline char g_env_openblas[] = "OPENBLAS_THREAD_TIMEOUT=16";  // idle OpenBLAS threads sleep after 2^16 cycles
inline char* const g_env_wanted[] = {g_env_omp, g_env_openblas};
inline char* g_env_lent[2] = {nullptr, nullptr};

#ifndef HS_PREINIT_STATE_ONLY  // a test reads the state above without adding a second entry
static bool env_has(char** envp, const char* entry) {
    const size_t n = std::strchr(entry, '=') - entry + 1;  // "NAME="
    for (char** e = envp; *e; ++e)
        if (std::strncmp(*e, entry, n) == 0) return true;
    return false;
}

static void preinit_lend_env_slots(int, char**, char** envp) {
    if (!envp) return;
    static const char* const kSpare[] = {"_=", "SHLVL=", "OLDPWD="};
    size_t next_spare = 0;
    for (size_t w = 0; w < 2; ++w) {
        if (env_has(envp, g_env_wanted[w])) continue;
        for (; next_spare < 3 && !g_env_lent[w]; ++next_spare) {
            const char* spare = kSpare[next_spare];
            for (char** e = envp; *e; ++e) {
                if (std::strncmp(*e, spare, std::strlen(spare)) == 0) {
                    g_env_lent[w] = *e;
                    *e = g_env_wanted[w];
                    break;
                }
            }
        }
    }
}

__attribute__((constructor)) static void restore_env_slots() {
    for (size_t w = 0; w < 2; ++w) {
        if (!g_env_lent[w]) continue;
        for (char** e = environ; e && *e; ++e) {
            if (*e == g_env_wanted[w]) {
                *e = g_env_lent[w];
                break;
            }
        }
    }
}

// Only executables honour .preinit_array; the pointer is `used` so the linker keeps it.
__attribute__((section(".preinit_array"), used)) static void (*const preinit_entry)(int, char**, char**) =
    &preinit_lend_env_slots;
#endif

}  // namespace hs::detail
