/* The nonewprivs image's program, installed setuid root: run as another user it prints 0 when the
 * kernel honoured the setuid bit and that user's uid when no_new_privs stopped it
 * (allowPrivilegeEscalation: false). */
#include <stdio.h>
#include <unistd.h>

int main(void) {
    printf("Effective uid: %d\n", (int)geteuid());
    return 0;
}
