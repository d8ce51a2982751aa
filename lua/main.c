/* The zrun program: embeds LuaJIT, finds its Lua library next to the executable, and runs a
 * script, a -e chunk, a subcommand (report, check, estimate, plan, plot, zero-to-fp32, inspect) or the REPL.
 * Scripts run under lua_pcall; an error prints its message (and with ZRUN_DEBUG=1 the traceback)
 * and exits 1. */
#include <lauxlib.h>
#include <libgen.h>
#include <limits.h>
#include <lua.h>
#include <lualib.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bind.h"
#include "core/alloc.h"
#include "zero/comm.h"

int luaopen_cjson(lua_State *L);

/* The message a failed script prints: one line saying what went wrong (zrun's errors name the
 * fix); the Lua stack traceback only with ZRUN_DEBUG=1, which an error from inside a file (a
 * "file.lua:N:" position, likely a bug) points to. */
static int traceback(lua_State *L) {
    const char *msg = lua_tostring(L, 1);
    if (!msg) {
        if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) return 1;
        msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    }
    const char *dbg = getenv("ZRUN_DEBUG");
    if (dbg && *dbg && strcmp(dbg, "0") != 0) {
        luaL_traceback(L, L, msg, 1);
        return 1;
    }
    const char *pos = strstr(msg, ".lua:");
    if (pos && pos - msg < 200 && !memchr(msg, ' ', (size_t)(pos - msg)))
        lua_pushfstring(L, "%s\n(ZRUN_DEBUG=1 shows where it came from)", msg);
    else
        lua_pushstring(L, msg);
    return 1;
}

/* Runs the function on top of the stack with nargs arguments below it; reports errors. */
static int docall(lua_State *L, int nargs) {
    int base = lua_gettop(L) - nargs;
    lua_pushcfunction(L, traceback);
    lua_insert(L, base);
    int st = lua_pcall(L, nargs, 0, base);
    lua_remove(L, base);
    if (st) {
        const char *m = lua_tostring(L, -1);
        /* Under a launcher, one rank's error must stop every rank rather than leave them hanging
         * in a collective. */
        fflush(stdout); /* what the script printed comes first in a log that holds both streams */
        if (zr_comm_get()->world_size > 1) zr_comm_abort(m ? m : "(error without message)", 1);
        fprintf(stderr, "zrun: %s\n", m ? m : "(error without message)");
        fflush(stderr);
        lua_pop(L, 1);
    }
    return st;
}

/* Ctrl-C while a script or subcommand runs: one line (rank 0's) saying so and, from the Trainer, which
 * checkpoint a resume would continue from; then the default action, so that the shell and a launcher see
 * the signal (status 130). Only write(2) in here: nothing else is safe inside a handler. (SIGTERM keeps
 * its default: mpirun sends it to every rank after one fails, and that rank has said why.) */
static void on_interrupt(int sig) {
    if (zr_comm_get()->rank == 0) {
        static const char head[] = "\nzrun: interrupted (Ctrl-C)";
        const char *note = zr_l_interrupt_note();
        int nl = isatty(2); /* (on a terminal the newline ends a progress bar's line; a log needs none) */
        ssize_t r = write(2, head + !nl, sizeof head - 1 - !nl);
        if (*note) {
            r = write(2, "; ", 2);
            r = write(2, note, strlen(note));
        }
        r = write(2, "\n", 1);
        (void)r;
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

/* `zrun PATH` where PATH is no file: zrun.cli's one line (a close name, zrun's own recipe) replaces
 * luaL_loadfile's message on top of the stack. */
static void missing_script(lua_State *L, const char *path) {
    lua_getglobal(L, "require");
    lua_pushstring(L, "zrun.cli");
    if (lua_pcall(L, 1, 1, 0)) {
        lua_pop(L, 1);
        return;
    }
    lua_getfield(L, -1, "missing_script");
    lua_remove(L, -2);
    lua_pushstring(L, path);
    if (lua_pcall(L, 1, 1, 0) || !lua_isstring(L, -1)) {
        lua_pop(L, 1);
        return;
    }
    lua_replace(L, -2);
}

/* Directory holding lua/zrun: next to the executable, or $ZRUN_HOME. */
static void find_home(char *out, size_t len, const char *argv0) {
    const char *env = getenv("ZRUN_HOME");
    if (env && *env) {
        snprintf(out, len, "%s", env);
        return;
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        if (!realpath(argv0, exe)) snprintf(exe, sizeof exe, "%s", argv0);
    } else
        exe[n] = 0;
    snprintf(out, len, "%s", dirname(exe));
    char probe[PATH_MAX + 32];
    snprintf(probe, sizeof probe, "%s/lua/zrun/init.lua", out);
    if (access(probe, R_OK) != 0) { /* installed layout: bin/zrun + share/zrun/lua */
        char alt[PATH_MAX];
        snprintf(alt, sizeof alt, "%s/../share/zrun", out);
        snprintf(out, len, "%s", alt);
    }
}

/* zrun cannot run without its Lua library (lua/zrun/init.lua under home): one line naming where it
 * looked and the fix, instead of Lua's multi-line "module 'zrun' not found". */
static int home_missing(const char *home) {
    char probe[PATH_MAX + 32];
    snprintf(probe, sizeof probe, "%s/lua/zrun/init.lua", home);
    if (access(probe, R_OK) == 0) return 0;
    const char *env = getenv("ZRUN_HOME");
    if (env && *env)
        fprintf(stderr, "zrun: ZRUN_HOME=%s holds no lua/zrun/init.lua: point it at zrun's folder (the one with lua/ "
                        "and recipes/), or unset it to use the library next to the zrun executable\n", env);
    else
        fprintf(stderr, "zrun: zrun's Lua library is not at %s: keep the zrun executable next to its lua/ folder "
                        "(or install share/zrun beside bin/), or set ZRUN_HOME to zrun's folder\n", probe);
    return 1;
}

/* ZRUN_COLLECT_FLOOR_MB: how many MiB of host tensors may pile up past the live ones before the
 * collector runs (core/alloc.h; default 256). Anything but a positive integer is refused. */
static int collect_floor_from_env(void) {
    const char *e = getenv("ZRUN_COLLECT_FLOOR_MB");
    if (!e) return 0;
    char *end;
    long long mb = strtoll(e, &end, 10);
    if (end == e || *end || mb <= 0 || mb > ((long long)1 << 40)) {
        fprintf(stderr,
                "zrun: ZRUN_COLLECT_FLOOR_MB=%s: use a positive whole number of MiB (default %d)\n", e,
                (int)(ZR_MEM_COLLECT_FLOOR >> 20));
        return -1;
    }
    zr_mem_set_collect_floor((int64_t)mb << 20);
    return 0;
}

static void setup(lua_State *L, const char *home, int argc, char **argv, int script_idx) {
    luaL_openlibs(L);
    /* Load forwarding off in compiled traces: Debian's LuaJIT 2.1 snapshot (git20220320) forwards loads from
     * table constructors wrongly (TDUP/TNEW; upstream fix c42c62e7, LuaJIT issue #994): a looping trace visited
     * only the first entries of a list literal, and the memory plan lost whole layers' parameters. Off, no
     * shape of that bug can reach zrun's Lua; measured (CONTRIBUTING.md): no cost in the training loop. */
    if (luaL_dostring(L, "if jit and jit.opt then jit.opt.start('-fwd') end")) lua_pop(L, 1);
    zr_mem_set_collector(zr_l_alloc_collect, L);
    lua_getglobal(L, "package");
    lua_pushfstring(L, "%s/lua/?.lua;%s/lua/?/init.lua;./?.lua", home, home);
    lua_setfield(L, -2, "path");
    lua_pushstring(L, "");
    lua_setfield(L, -2, "cpath"); /* zrun is self-contained: no C modules from the system */
    lua_getfield(L, -1, "preload");
    lua_pushcfunction(L, luaopen_cjson);
    lua_setfield(L, -2, "cjson");
    lua_pushcfunction(L, luaopen_zrun_C);
    lua_setfield(L, -2, "zrun._C");
    lua_pop(L, 2);
    lua_pushstring(L, home);
    lua_setglobal(L, "ZRUN_HOME");
    /* arg table as luajit builds it: arg[0] = script, arg[1..] = its arguments */
    lua_createtable(L, argc, 2);
    for (int i = 0; i < argc; i++) {
        lua_pushstring(L, argv[i]);
        lua_rawseti(L, -2, i - script_idx);
    }
    lua_setglobal(L, "arg");
}

static void usage(void) {
    printf("usage: zrun [script.lua [args...]]     run a recipe or script\n"
           "       zrun                            interactive REPL (zrun modules preloaded as zr)\n"
           "       zrun -e 'code'                  run a chunk of Lua\n"
           "       zrun report                     versions, build flags, backends, devices\n"
           "       zrun check CONFIG.json          validate a DeepSpeed-style config\n"
           "       zrun zero-to-fp32 DIR [--tag T] OUT.safetensors   consolidate a ZeRO checkpoint (zrun's or DeepSpeed's)\n"
           "       zrun inspect PATH [--depth N]                     what a .pt/.bin/.safetensors file or folder holds\n"
           "       zrun estimate MODEL --gpus-per-node N --nodes M   DeepSpeed's model-state estimates\n"
           "       zrun plan MODEL [--config ds.json] [--fit]        full per-rank memory plan\n"
           "       zrun plot RUN_DIR [--out F.svg]                   a run's curves: SVG and a text chart\n"
           "       zrun --version | --help\n");
}

int main(int argc, char **argv) {
    char home[PATH_MAX];
    find_home(home, sizeof home, argv[0]);
    lua_State *L = luaL_newstate();
    if (!L) {
        fprintf(stderr, "zrun: cannot create Lua state (out of memory)\n");
        return 1;
    }
    int status = 0;
    if (collect_floor_from_env()) return 1;
    const char *a1 = argc > 1 ? argv[1] : NULL;
    if (a1 && (!strcmp(a1, "--version") || !strcmp(a1, "-v"))) {
        printf("zrun %s (%s)\n", ZR_VERSION, ZR_GIT_REV);
        return 0;
    }
    if (a1 && (!strcmp(a1, "--help") || !strcmp(a1, "-h"))) {
        usage();
        return 0;
    }
    if (home_missing(home)) return 1;
    if (a1) signal(SIGINT, on_interrupt); /* (not in the REPL: readline handles Ctrl-C at its prompt) */
    /* A log file or a pipe gets each line as it is printed (as a terminal does): a run stopped by Ctrl-C
     * or a kill, which flushes nothing, keeps its log up to the last line. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    static const char *subcommands[] = {"report", "check", "zero-to-fp32", "inspect", "estimate", "plan", "plot", NULL};
    int sub = 0;
    for (int i = 0; a1 && subcommands[i]; i++)
        if (!strcmp(a1, subcommands[i])) sub = 1;
    if (a1 && !strcmp(a1, "-e")) {
        if (argc < 3) {
            fprintf(stderr, "zrun: -e needs a chunk of Lua\n");
            return 1;
        }
        setup(L, home, argc, argv, 2);
        if (luaL_loadbuffer(L, argv[2], strlen(argv[2]), "=(command line)")) {
            fprintf(stderr, "zrun: %s\n", lua_tostring(L, -1));
            status = 1;
        } else
            status = docall(L, 0);
    } else if (sub) { /* require("zrun.cli").main(cmd, args...) */
        setup(L, home, argc, argv, 1);
        lua_getglobal(L, "require");
        lua_pushstring(L, "zrun.cli");
        if (lua_pcall(L, 1, 1, 0)) {
            fprintf(stderr, "zrun: %s\n", lua_tostring(L, -1));
            status = 1;
        } else {
            lua_getfield(L, -1, "main");
            lua_remove(L, -2);
            for (int i = 1; i < argc; i++) lua_pushstring(L, argv[i]);
            status = docall(L, argc - 1);
        }
    } else if (a1 && a1[0] != '-') {
        setup(L, home, argc, argv, 1);
        if (luaL_loadfile(L, a1)) {
            if (access(a1, F_OK) != 0) missing_script(L, a1);
            fprintf(stderr, "zrun: %s\n", lua_tostring(L, -1));
            status = 1;
        } else {
            for (int i = 2; i < argc; i++) lua_pushstring(L, argv[i]);
            status = docall(L, argc - 2);
        }
    } else if (!a1) {
        setup(L, home, argc, argv, 0);
        lua_getglobal(L, "require");
        lua_pushstring(L, "zrun.repl");
        if (lua_pcall(L, 1, 1, 0)) {
            fprintf(stderr, "zrun: %s\n", lua_tostring(L, -1));
            status = 1;
        } else {
            lua_getfield(L, -1, "run");
            lua_remove(L, -2);
            status = docall(L, 0);
        }
    } else {
        fprintf(stderr, "zrun: unknown option '%s' (zrun --help lists what zrun takes; a script's options go after it: "
                        "zrun SCRIPT.lua %s)\n", a1, a1);
        status = 1;
    }
    zr_mem_set_collector(NULL, NULL);
    lua_close(L);
    zr_comm_finalize();
    return status ? 1 : 0;
}
