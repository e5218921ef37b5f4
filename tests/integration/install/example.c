/* A program written only against the installed <gpumem/gpumem.h>: allocates
 * 8 MiB, writes and verifies it, says "ready", and frees once stdin closes. */
#include <gpumem/gpumem.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
        gpumem_client *c;
        int r = gpumem_connect(argc > 1 ? argv[1] : NULL, &c);
        if (r < 0) {
                fprintf(stderr, "connect: %s\n", gpumem_strerror(r));
                return 1;
        }
        void *p;
        size_t size = 8u << 20;
        if ((r = gpumem_alloc(c, size, 0, &p)) < 0) {
                fprintf(stderr, "alloc: %s\n", gpumem_last_error(c));
                return 1;
        }
        memset(p, 0x5a, size);
        for (size_t i = 0; i < size; i++)
                if (((unsigned char *) p)[i] != 0x5a)
                        return 1;
        printf("ready\n");
        fflush(stdout);
        char buf[16];
        while (read(STDIN_FILENO, buf, sizeof(buf)) > 0) {
        }
        gpumem_free(c, p);
        gpumem_disconnect(c);
        return 0;
}
