/* readline for the REPL: line editing, history file, and tab completion through a Lua
 * function (registered by lua/zrun/repl.lua). Falls back to fgets without readline. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bind.h"

#ifdef ZR_HAVE_READLINE
#include <readline/history.h>
#include <readline/readline.h>

static lua_State *completion_L;
static int completion_ref = LUA_NOREF;

/* Asks the Lua completer for candidates of `text`; readline frees the strings. */
static char **complete(const char *text, int start, int end) {
    (void)start;
    (void)end;
    rl_attempted_completion_over = 1;
    lua_State *L = completion_L;
    if (!L || completion_ref == LUA_NOREF) return NULL;
    lua_rawgeti(L, LUA_REGISTRYINDEX, completion_ref);
    lua_pushstring(L, rl_line_buffer);
    lua_pushstring(L, text);
    if (lua_pcall(L, 2, 1, 0) || !lua_istable(L, -1)) {
        lua_pop(L, 1);
        return NULL;
    }
    int n = (int)lua_objlen(L, -1);
    if (n == 0) {
        lua_pop(L, 1);
        return NULL;
    }
    char **out = calloc((size_t)n + 2, sizeof *out);
    /* out[0] is the common prefix readline substitutes */
    for (int i = 1; i <= n; i++) {
        lua_rawgeti(L, -1, i);
        out[i] = strdup(lua_tostring(L, -1) ? lua_tostring(L, -1) : "");
        lua_pop(L, 1);
    }
    size_t pre = strlen(out[1]);
    for (int i = 2; i <= n; i++) {
        size_t k = 0;
        while (k < pre && out[i][k] == out[1][k]) k++;
        pre = k;
    }
    out[0] = strndup(out[1], pre);
    lua_pop(L, 1);
    return out;
}
#endif

static int l_readline(lua_State *L) {
    const char *prompt = luaL_optstring(L, 1, "> ");
#ifdef ZR_HAVE_READLINE
    if (isatty(0)) {
        char *line = readline(prompt);
        if (!line) return 0;
        lua_pushstring(L, line);
        free(line);
        return 1;
    }
#endif
    fputs(prompt, stdout);
    fflush(stdout);
    char buf[65536];
    if (!fgets(buf, sizeof buf, stdin)) return 0;
    size_t n = strlen(buf);
    if (n && buf[n - 1] == '\n') buf[--n] = 0;
    lua_pushlstring(L, buf, n);
    return 1;
}

static int l_add_history(lua_State *L) {
#ifdef ZR_HAVE_READLINE
    add_history(luaL_checkstring(L, 1));
#endif
    return 0;
}
static int l_read_history(lua_State *L) {
#ifdef ZR_HAVE_READLINE
    read_history(luaL_checkstring(L, 1));
#endif
    return 0;
}
static int l_write_history(lua_State *L) {
#ifdef ZR_HAVE_READLINE
    write_history(luaL_checkstring(L, 1));
    history_truncate_file(luaL_checkstring(L, 1), 1000);
#endif
    return 0;
}
static int l_set_completer(lua_State *L) {
#ifdef ZR_HAVE_READLINE
    luaL_checktype(L, 1, LUA_TFUNCTION);
    lua_pushvalue(L, 1);
    completion_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    completion_L = L;
    rl_attempted_completion_function = complete;
    rl_basic_word_break_characters = " \t\n\"\\'`@$><=;|&{(,+-*/%^#[]";
#endif
    return 0;
}
static int l_isatty(lua_State *L) {
    lua_pushboolean(L, isatty((int)luaL_optinteger(L, 1, 0)));
    return 1;
}

static const luaL_Reg fns[] = {{"readline", l_readline}, {"add_history", l_add_history},
                               {"read_history", l_read_history}, {"write_history", l_write_history},
                               {"set_completer", l_set_completer}, {"isatty", l_isatty}, {NULL, NULL}};

void zr_bind_repl(lua_State *L) { zr_l_register_functions(L, fns); }
