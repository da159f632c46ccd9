/*
 * The pod sandbox's process (the image containerd calls the `sandbox_image`): it holds the
 * pod's namespaces open and does nothing else. It sleeps until SIGINT or SIGTERM and then
 * exits 0; as PID 1 of a pod that shares its PID namespace, it also reaps the zombies of
 * processes whose parents died. tests/cluster/up.sh uses the same binary as PID 1 of the
 * cluster's own PID namespace, for the same reason (containerd's shims are reparented to it).
 *
 * Built with `gcc -static -Os` into a FROM scratch image (tests/cluster/images.sh).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) {
    (void)sig;
    _exit(0);
}

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && (strcmp(argv[1], "-v") == 0 || strcmp(argv[1], "--version") == 0)) {
        puts("pause (proxima tests/cluster) 3.10");
        return 0;
    }
    struct sigaction on_stop = {.sa_handler = stop};
    struct sigaction on_child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP | SA_RESTART};
    sigemptyset(&on_stop.sa_mask);
    sigemptyset(&on_child.sa_mask);
    if (sigaction(SIGINT, &on_stop, NULL) < 0 || sigaction(SIGTERM, &on_stop, NULL) < 0 ||
        sigaction(SIGCHLD, &on_child, NULL) < 0) {
        perror("pause: sigaction");
        return 1;
    }
    for (;;) {
        pause();
    }
}
