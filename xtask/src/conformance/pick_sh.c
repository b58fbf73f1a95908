/* /bin/sh of the busybox stand-in images (busybox, nonroot, nonewprivs). Debian's busybox ash
 * leaves every variable whose name is not a shell name (`p-data-1`) out of the environment it
 * passes on, and the ConfigMap and Secret "via the environment" specs print such variables with
 * `sh -c env`; bash keeps them. Other specs expect ash's own words ("/bin/sh: can't create /file:
 * Read-only file system"), so this runs busybox's ash unless the environment holds such a name,
 * and bash then, with the arguments as given: busybox picks its applet from argv[0] ("sh"), and
 * bash named sh runs as a POSIX shell. */
#include <stdio.h>
#include <unistd.h>

extern char **environ;

/* Whether `entry` (NAME=value) has a name ash keeps: a letter or '_', then letters, digits, '_'. */
static int ash_keeps(const char *entry) {
    const char *p = entry;
    if (!((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') || *p == '_')) {
        return *p == '\0';
    }
    for (p++; *p != '=' && *p != '\0'; p++) {
        if (!((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') ||
              *p == '_')) {
            return 0;
        }
    }
    return 1;
}

int main(int argc, char **argv) {
    (void)argc;
    const char *shell = "/bin/busybox";
    for (char **entry = environ; *entry != NULL; entry++) {
        if (!ash_keeps(*entry)) {
            shell = "/bin/bash";
            break;
        }
    }
    execv(shell, argv);
    perror(shell);
    return 127;
}
