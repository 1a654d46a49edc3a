/*
 * /sbin/init of an orch sandbox LXC container (PID 1 in its PID namespace).
 *
 * Build: cc -O2 -o init init.c (dynamically linked: the container has the host's /usr)
 *
 * A real container runs systemd; the sandbox needs only what PID 1 owes its
 * namespace: reap every orphan (a daemonised tmux server is re-parented here),
 * and exit on SIGTERM/SIGINT/SIGPWR (lxc-stop's clean halt sends SIGPWR), which
 * ends the namespace and kills everything left in it. `pct stop` uses
 * lxc-stop --kill, which SIGKILLs this process from the host.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t stop;

static void on_stop(int sig) { stop = sig; }

static void on_child(int sig) { (void)sig; }

int main(void) {
    sigset_t block, wait_mask;
    struct sigaction sa = {0};
    sa.sa_handler = on_stop;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGPWR, &sa, NULL);
    sa.sa_handler = on_child;
    sigaction(SIGCHLD, &sa, NULL);
    signal(SIGHUP, SIG_IGN);
    sigemptyset(&block);
    sigaddset(&block, SIGCHLD);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGPWR);
    sigprocmask(SIG_BLOCK, &block, &wait_mask);
    sigdelset(&wait_mask, SIGCHLD);
    sigdelset(&wait_mask, SIGTERM);
    sigdelset(&wait_mask, SIGINT);
    sigdelset(&wait_mask, SIGPWR);
    for (;;) {
        while (waitpid(-1, NULL, WNOHANG) > 0) {
        }
        if (stop) return 0;
        sigsuspend(&wait_mask); /* returns after a handled signal: a child, or a stop */
    }
}
