/*
 * count_signals: counts the SIGTERMs and SIGINTs it receives (for `oomshim run`'s signal
 * handling: each signal the launcher receives reaches the program once). Prints "ready" once the handlers are installed, then waits until 700 ms
 * after the first signal (at most 20 s) and prints "term N int M". Exit 0.
 */
#include <signal.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t g_term, g_int;

static void on_signal(int sig) {
    if (sig == SIGTERM) g_term++;
    if (sig == SIGINT) g_int++;
}

int main(void) {
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    printf("ready\n");
    fflush(stdout);
    int after_first = -1;
    for (int ms = 0; ms < 20000; ms += 10) {
        if (after_first < 0 && (g_term || g_int)) after_first = 0;
        if (after_first >= 0 && (after_first += 10) >= 700) break;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    printf("term %d int %d\n", (int)g_term, (int)g_int);
    fflush(stdout);
    return 0;
}
