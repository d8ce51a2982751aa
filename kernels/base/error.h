/* Error reporting below lua/: functions return a status (0 = ok, <0 = error) or NULL, and leave a
 * message with file:line for zr_last_error(). Nothing here exits or longjmps; only lua/bind_*.c
 * turns a message into a Lua error. The message buffer is per thread. */
#ifndef ZR_ERROR_H
#define ZR_ERROR_H

typedef int zr_status;
#define ZR_OK 0
#define ZR_ERR -1

/* Records a printf-style message prefixed by "file:line: " and returns ZR_ERR. */
zr_status zr_set_error_at(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#define zr_error(...) zr_set_error_at(__FILE__, __LINE__, __VA_ARGS__)
/* Same, returning NULL, for constructors. */
#define zr_error_null(...) (zr_set_error_at(__FILE__, __LINE__, __VA_ARGS__), (void *)0)

/* Prepends context ("linear: ") to the current message, keeping the location. */
void zr_error_prefix(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

const char *zr_last_error(void);
/* The message without its "file:line: " prefix (what users see). */
const char *zr_last_error_message(void);
void zr_clear_error(void);

#define ZR_CHECK(expr)                                                                             \
    do {                                                                                           \
        if ((expr) != ZR_OK) return ZR_ERR;                                                        \
    } while (0)

#endif
