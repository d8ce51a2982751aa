/* OpenBLAS's kernels for this CPU (see zr_blas_core in kernels.h). Not precision-specific: compiled in
 * the f32 pass only (the Makefile builds every kernels/cpu file twice). */
#ifndef ZR_REAL_F64
#include "kernels.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef ZR_HAVE_OPENBLAS
char *openblas_get_corename(void);
/* DYNAMIC_ARCH's selection (driver/others/dynamic.c): quit forgets the choice, init makes it again, reading
 * OPENBLAS_CORETYPE as at start-up. Weak: an OpenBLAS built for one core has neither, and nothing changes. */
void gotoblas_dynamic_init(void) __attribute__((weak));
void gotoblas_dynamic_quit(void) __attribute__((weak));

/* Cores OpenBLAS falls back to, without AVX: a CPU model it does not know (0.3.21 and Sapphire Rapids, or a
 * virtual machine's generic model) gets these whatever the CPU has. */
static const char *const NO_AVX[] = {"Prescott", "Katmai", "Coppermine", "Northwood", "Banias", "Core2",
                                     "Penryn", "Dunnington", "Nehalem", "Atom", NULL};
static char note[160];

static void choose(void) {
    if (getenv("OPENBLAS_CORETYPE") || !gotoblas_dynamic_init || !gotoblas_dynamic_quit) return;
    const char *found = openblas_get_corename();
    int fallback = 0;
    for (int i = 0; found && NO_AVX[i]; i++) fallback |= !strcmp(found, NO_AVX[i]);
    if (!fallback) return;
    __builtin_cpu_init(); /* (each check below includes the OS's support: XCR0) */
    const char *want = NULL;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        want = "SkylakeX";
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        want = "Haswell";
    else if (__builtin_cpu_supports("avx"))
        want = "Sandybridge";
    if (!want) return;
    char was[32];
    snprintf(was, sizeof was, "%s", found);
    setenv("OPENBLAS_CORETYPE", want, 1);
    gotoblas_dynamic_quit();
    gotoblas_dynamic_init();
    unsetenv("OPENBLAS_CORETYPE");
    snprintf(note, sizeof note, "kernels chosen by the CPU's features (OpenBLAS did not know its model and took %s)",
             was);
}

const char *zr_blas_core(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, choose);
    return note[0] ? note : NULL;
}
#else
const char *zr_blas_core(void) { return NULL; }
#endif
#endif
