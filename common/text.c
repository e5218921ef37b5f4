#include "text.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* Length of the well-formed UTF-8 sequence at s (1..4) that is not a control
 * character, or 0. */
static size_t printable_utf8(const unsigned char *s) {
        unsigned char c = s[0];
        if (c >= 0x20 && c < 0x7f)
                return 1;
        size_t n;
        uint32_t cp, min;
        if (c >= 0xc2 && c <= 0xdf)
                n = 2, cp = c & 0x1f, min = 0x80;
        else if (c >= 0xe0 && c <= 0xef)
                n = 3, cp = c & 0x0f, min = 0x800;
        else if (c >= 0xf0 && c <= 0xf4)
                n = 4, cp = c & 0x07, min = 0x10000;
        else
                return 0; /* ASCII control, DEL, a continuation byte, or never valid */
        for (size_t i = 1; i < n; i++) {
                if ((s[i] & 0xc0) != 0x80)
                        return 0; /* also stops at the NUL */
                cp = (cp << 6) | (s[i] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff) || (cp >= 0x80 && cp <= 0x9f))
                return 0; /* overlong, out of range, a surrogate, or a C1 control */
        return n;
}

char *gm_text_escape(const char *in, char *out, size_t out_len) {
        size_t o = 0;
        const unsigned char *s = (const unsigned char *) (in ? in : "");
        while (*s) {
                size_t n = *s == '\\' ? 0 : printable_utf8(s);
                char esc[5];
                const char *piece = (const char *) s;
                size_t piece_len = n;
                if (n == 0) {
                        if (*s == '\\')
                                memcpy(esc, "\\\\", 3);
                        else
                                snprintf(esc, sizeof(esc), "\\x%02x", *s);
                        piece = esc;
                        piece_len = strlen(esc);
                        n = 1;
                }
                if (o + piece_len >= out_len)
                        break;
                memcpy(out + o, piece, piece_len);
                o += piece_len;
                s += n;
        }
        out[o] = '\0';
        return out;
}

void gm_text_append(char *buf, size_t len, const char *fmt, ...) {
        size_t used = strlen(buf);
        if (used + 1 >= len)
                return;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf + used, len - used, fmt, ap);
        va_end(ap);
}

bool gm_text_tag_valid(const char *tag, bool allow_empty) {
        size_t n = 0;

        if (!tag)
                return false;
        for (; tag[n]; n++) {
                char ch = tag[n];
                bool ok = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
                          ch == '_' || ch == '.' || ch == '-';
                if (!ok || n >= GM_TAG_NAME_MAX)
                        return false;
        }
        return n > 0 || allow_empty;
}
