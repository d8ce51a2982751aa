/* Per-thread error message storage for the runtime (see error.h). */
#include "kernels/base/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char err_buf[2048];
static _Thread_local int err_msg_start; /* index where the message starts after "file:line: " */

zr_status zr_set_error_at(const char *file, int line, const char *fmt, ...) {
    const char *base = strrchr(file, '/');
    int n = snprintf(err_buf, sizeof err_buf, "%s:%d: ", base ? base + 1 : file, line);
    if (n < 0 || n >= (int)sizeof err_buf) n = 0;
    err_msg_start = n;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_buf + n, sizeof err_buf - (size_t)n, fmt, ap);
    va_end(ap);
    return ZR_ERR;
}

void zr_error_prefix(const char *fmt, ...) {
    char pre[256], rest[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    snprintf(rest, sizeof rest, "%s", err_buf + err_msg_start);
    char loc[256];
    snprintf(loc, sizeof loc, "%.*s", err_msg_start, err_buf);
    snprintf(err_buf, sizeof err_buf, "%s%s%s", loc, pre, rest);
}

const char *zr_last_error(void) { return err_buf[0] ? err_buf : "unknown error"; }
const char *zr_last_error_message(void) {
    return err_buf[0] ? err_buf + err_msg_start : "unknown error";
}
void zr_clear_error(void) {
    err_buf[0] = 0;
    err_msg_start = 0;
}
