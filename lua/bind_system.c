/* Build and system facts for `zrun report`: compiled-in features, library versions, threads; the
 * clock and terminal facts the progress bar needs. */
#include <omp.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "bind.h"
#include "kernels/cpu/kernels.h"

#ifdef ZR_HAVE_OPENBLAS
char *openblas_get_config(void);
int openblas_get_num_threads(void);
#endif
#ifdef ZR_HAVE_MPI
#include <mpi.h>
#endif
#ifdef ZR_HAVE_CUDA
#include <cuda_runtime_api.h>
const char *zr_nccl_version(char *buf);
#endif
#ifdef ZR_HAVE_PCRE2
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#endif
#ifdef ZR_HAVE_UTF8PROC
#include <utf8proc.h>
#endif

static void setbool(lua_State *L, const char *k, int v) {
    lua_pushboolean(L, v);
    lua_setfield(L, -2, k);
}
static void setstr(lua_State *L, const char *k, const char *v) {
    lua_pushstring(L, v);
    lua_setfield(L, -2, k);
}

static int l_build_info(lua_State *L) {
    lua_newtable(L);
    setstr(L, "version", ZR_VERSION);
    setstr(L, "git_rev", ZR_GIT_REV);
    setstr(L, "compiler", __VERSION__);
    setstr(L, "built", __DATE__ " " __TIME__);
#ifdef ZR_HAVE_OPENBLAS
    setbool(L, "openblas", 1);
    const char *core_note = zr_blas_core(); /* (before the config: it names the kernels in use) */
    if (core_note) setstr(L, "openblas_core_note", core_note);
    setstr(L, "openblas_config", openblas_get_config());
    lua_pushinteger(L, openblas_get_num_threads());
    lua_setfield(L, -2, "openblas_threads");
#else
    setbool(L, "openblas", 0);
#endif
#ifdef ZR_HAVE_MPI
    setbool(L, "mpi", 1);
    {
        char v[MPI_MAX_LIBRARY_VERSION_STRING];
        int n = 0;
        MPI_Get_library_version(v, &n);
        char *nl = strchr(v, '\n');
        if (nl) *nl = 0;
        char *comma = strchr(v, ',');
        if (comma) *comma = 0;
        setstr(L, "mpi_version", v);
    }
#else
    setbool(L, "mpi", 0);
#endif
#ifdef ZR_HAVE_CUDA
    setbool(L, "cuda", 1);
    {
        int rv = 0, dv = 0;
        char v[32];
        cudaRuntimeGetVersion(&rv);
        cudaDriverGetVersion(&dv);
        snprintf(v, sizeof v, "%d.%d", rv / 1000, (rv % 1000) / 10);
        setstr(L, "cuda_runtime", v);
        if (dv) snprintf(v, sizeof v, "%d.%d", dv / 1000, (dv % 1000) / 10);
        else snprintf(v, sizeof v, "none");
        setstr(L, "cuda_driver", v);
    }
#ifdef ZR_HAVE_NCCL
    {
        char v[32];
        setstr(L, "nccl_version", zr_nccl_version(v));
    }
#endif
#else
    setbool(L, "cuda", 0);
#endif
#ifdef ZR_HAVE_NCCL
    setbool(L, "nccl", 1);
#else
    setbool(L, "nccl", 0);
#endif
#ifdef ZR_HAVE_PCRE2
    setbool(L, "pcre2", 1);
    {
        char v[64] = "";
        pcre2_config(PCRE2_CONFIG_VERSION, v);
        setstr(L, "pcre2_version", v);
    }
#else
    setbool(L, "pcre2", 0);
#endif
#ifdef ZR_HAVE_UTF8PROC
    setbool(L, "utf8proc", 1);
    setstr(L, "utf8proc_version", utf8proc_version());
    setstr(L, "unicode_version", utf8proc_unicode_version());
#else
    setbool(L, "utf8proc", 0);
#endif
#ifdef ZR_HAVE_READLINE
    setbool(L, "readline", 1);
#else
    setbool(L, "readline", 0);
#endif
    lua_pushinteger(L, omp_get_max_threads());
    lua_setfield(L, -2, "omp_threads");
    lua_pushinteger(L, (int)sysconf(_SC_NPROCESSORS_ONLN));
    lua_setfield(L, -2, "cpus");
    return 1;
}

double zr_l_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
/* Monotonic wall clock in seconds (for timing in recipes and benchmarks). */
static int l_now(lua_State *L) {
    lua_pushnumber(L, zr_l_now());
    return 1;
}

/* Columns of the terminal on file descriptor fd (default 1), or nil when it is not a terminal. */
static int l_terminal_width(lua_State *L) {
    struct winsize ws;
    int fd = (int)luaL_optinteger(L, 1, 1);
    if (!isatty(fd) || ioctl(fd, TIOCGWINSZ, &ws) != 0 || ws.ws_col == 0) return 0;
    lua_pushinteger(L, ws.ws_col);
    return 1;
}

/* What a Ctrl-C adds after "interrupted" (main.c's handler): the Trainer keeps it current (the checkpoint
 * a resume would continue from). A fixed buffer, as the handler may only write(2) it; its first byte is
 * set last, so that a signal during an update prints nothing rather than half a note. */
static char interrupt_note[1024];
const char *zr_l_interrupt_note(void) { return interrupt_note; }

/* set_interrupt_note([text]): the note, or none without text. */
static int l_set_interrupt_note(lua_State *L) {
    size_t n;
    const char *s = luaL_optlstring(L, 1, "", &n);
    if (n >= sizeof interrupt_note) n = sizeof interrupt_note - 1;
    interrupt_note[0] = 0;
    if (n == 0) return 0;
    memcpy(interrupt_note + 1, s + 1, n - 1);
    interrupt_note[n] = 0;
    interrupt_note[0] = s[0];
    return 0;
}

static const luaL_Reg fns[] = {{"build_info", l_build_info},
                               {"now", l_now},
                               {"terminal_width", l_terminal_width},
                               {"set_interrupt_note", l_set_interrupt_note},
                               {NULL, NULL}};
void zr_bind_system(lua_State *L) { zr_l_register_functions(L, fns); }
