/* A gRPC health server small enough to build statically with gcc and run in a busybox pod, for the
 * gRPC probe tests: it speaks just enough HTTP/2 (cleartext, prior knowledge) to answer every
 * grpc.health.v1.Health/Check with SERVING, or NOT_SERVING while the file named by its second
 * argument exists. Request headers and the requested service are not decoded.
 *
 * usage: grpc_health PORT [NOT_SERVING_FILE] */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

enum { DATA = 0, HEADERS = 1, SETTINGS = 4, PING = 6, GOAWAY = 7 };
enum { END_STREAM = 1, ACK = 1, END_HEADERS = 4 };

static int read_full(int fd, unsigned char *buf, size_t len) {
    size_t got = 0;
    while (got < len) {
        ssize_t n = read(fd, buf + got, len - got);
        if (n <= 0) return -1;
        got += (size_t)n;
    }
    return 0;
}

static int write_frame(int fd, int type, int flags, uint32_t stream, const unsigned char *payload,
                       size_t len) {
    unsigned char head[9] = {(unsigned char)(len >> 16), (unsigned char)(len >> 8),
                             (unsigned char)len, (unsigned char)type, (unsigned char)flags,
                             (unsigned char)(stream >> 24), (unsigned char)(stream >> 16),
                             (unsigned char)(stream >> 8), (unsigned char)stream};
    if (write(fd, head, sizeof head) != (ssize_t)sizeof head) return -1;
    if (len > 0 && write(fd, payload, len) != (ssize_t)len) return -1;
    return 0;
}

static int answer(int fd, uint32_t stream, const char *not_serving) {
    struct stat st;
    int serving = !(not_serving && stat(not_serving, &st) == 0);
    /* :status 200 (static table 8), content-type (static name 31) application/grpc. */
    static const unsigned char headers[] = {0x88, 0x0f, 0x10, 16, 'a', 'p', 'p', 'l', 'i', 'c',
                                            'a',  't',  'i',  'o', 'n', '/', 'g', 'r', 'p', 'c'};
    /* One gRPC message: uncompressed, 2 bytes: field 1 (status) = SERVING (1) or NOT_SERVING (2). */
    unsigned char message[] = {0, 0, 0, 0, 2, 0x08, (unsigned char)(serving ? 1 : 2)};
    /* grpc-status: 0, a literal with a new name. */
    static const unsigned char trailers[] = {0x00, 11, 'g', 'r', 'p', 'c', '-', 's', 't', 'a',
                                             't',  'u', 's', 1,   '0'};
    if (write_frame(fd, HEADERS, END_HEADERS, stream, headers, sizeof headers) < 0) return -1;
    if (write_frame(fd, DATA, 0, stream, message, sizeof message) < 0) return -1;
    return write_frame(fd, HEADERS, END_HEADERS | END_STREAM, stream, trailers, sizeof trailers);
}

static void serve(int fd, const char *not_serving) {
    unsigned char preface[24];
    if (read_full(fd, preface, sizeof preface) < 0 ||
        memcmp(preface, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", sizeof preface) != 0)
        return;
    if (write_frame(fd, SETTINGS, 0, 0, NULL, 0) < 0) return;
    for (;;) {
        unsigned char head[9];
        if (read_full(fd, head, sizeof head) < 0) return;
        size_t len = ((size_t)head[0] << 16) | ((size_t)head[1] << 8) | head[2];
        int type = head[3], flags = head[4];
        uint32_t stream = ((uint32_t)(head[5] & 0x7f) << 24) | ((uint32_t)head[6] << 16) |
                          ((uint32_t)head[7] << 8) | head[8];
        unsigned char *payload = malloc(len ? len : 1);
        if (!payload || read_full(fd, payload, len) < 0) return;
        int failed = 0;
        if (type == SETTINGS && !(flags & ACK)) {
            failed = write_frame(fd, SETTINGS, ACK, 0, NULL, 0);
        } else if (type == PING && !(flags & ACK)) {
            failed = write_frame(fd, PING, ACK, 0, payload, len);
        } else if ((type == DATA || type == HEADERS) && (flags & END_STREAM)) {
            failed = answer(fd, stream, not_serving);
        } else if (type == GOAWAY) {
            failed = -1;
        }
        free(payload);
        if (failed) return;
    }
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    const char *not_serving = argc > 2 ? argv[2] : NULL;
    signal(SIGCHLD, SIG_IGN);
    signal(SIGTERM, SIG_DFL);
    int listener = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1]))};
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    if (bind(listener, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(listener, 64) < 0)
        return 1;
    for (;;) {
        int fd = accept(listener, NULL, NULL);
        if (fd < 0) continue;
        if (fork() == 0) {
            close(listener);
            serve(fd, not_serving);
            _exit(0);
        }
        close(fd);
    }
}
