/*
 * launcher_helper: small programs for tests/launcher.rs (`oomshim run` compared with the same
 * command run bare).
 *
 *   launcher_helper ignchld PROG ARGS...  - execs PROG with SIGCHLD ignored, as some launchers
 *                                           and daemons leave it.
 *   launcher_helper waitcore PROG ARGS... - runs PROG as its child and prints how it ended:
 *                                           "exited N" or "signal N core C" (WCOREDUMP).
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc > 2 && strcmp(argv[1], "ignchld") == 0) {
        signal(SIGCHLD, SIG_IGN);
        execvp(argv[2], argv + 2);
        perror("execvp");
        return 127;
    }
    if (argc > 2 && strcmp(argv[1], "waitcore") == 0) {
        pid_t pid = fork();
        if (pid == 0) {
            execvp(argv[2], argv + 2);
            _exit(127);
        }
        int status = 0;
        if (waitpid(pid, &status, 0) != pid) {
            perror("waitpid");
            return 1;
        }
        if (WIFEXITED(status))
            printf("exited %d\n", WEXITSTATUS(status));
        else if (WIFSIGNALED(status))
            printf("signal %d core %d\n", WTERMSIG(status), WCOREDUMP(status) ? 1 : 0);
        return 0;
    }
    fprintf(stderr, "usage: launcher_helper ignchld|waitcore PROG ARGS...\n");
    return 2;
}
