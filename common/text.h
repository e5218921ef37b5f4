/* Text that came from someone else, made safe to print: logs, metrics,
 * `gpumemctl clients`, snapshots. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

/* Copies `in` into out (capacity out_len > 0, always NUL-terminated) with
 * every control character (C0, DEL, and C1 as UTF-8), every byte that is not
 * part of well-formed UTF-8, and the backslash written as "\xNN" ("\\" for
 * the backslash), so that no newline, terminal escape or syslog "<N>" prefix
 * at a line's start can come through. An escape is never cut in half: what
 * does not fit is left out whole. Returns out. */
char *gm_text_escape(const char *in, char *out, size_t out_len);
/* Appends the formatted text to the string in buf (capacity len), as far as
 * it fits; buf stays NUL-terminated. */
void gm_text_append(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* A tagged pool's name ([A-Za-z0-9_.-]{1,GM_TAG_NAME_MAX}); "" (the default
 * pool) only with allow_empty. The one check the client and the daemon share. */
#define GM_TAG_NAME_MAX 31
bool gm_text_tag_valid(const char *tag, bool allow_empty);
