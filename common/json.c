#include "json.h"

const char *gm_json_escape_byte(unsigned char c, char buf[8]) {
        switch (c) {
        case '"':
                return "\\\"";
        case '\\':
                return "\\\\";
        case '\b':
                return "\\b";
        case '\f':
                return "\\f";
        case '\n':
                return "\\n";
        case '\r':
                return "\\r";
        case '\t':
                return "\\t";
        default:
                if (c >= 0x20)
                        return NULL;
                snprintf(buf, 8, "\\u%04x", c);
                return buf;
        }
}

void gm_json_print_string(FILE *f, const char *s) {
        fputc('"', f);
        for (; *s; s++) {
                char buf[8];
                const char *esc = gm_json_escape_byte((unsigned char) *s, buf);
                if (esc)
                        fputs(esc, f);
                else
                        fputc(*s, f);
        }
        fputc('"', f);
}
