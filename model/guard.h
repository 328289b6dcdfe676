// Fatal signals meet mapped and half-written files here. A mapped file that someone truncates
// turns reads of its lost pages into SIGBUS; a program stopped mid-write leaves a partial file.
// The file code registers what it maps (guard_map) and what it is writing (guard_output); a
// program that wants the handling calls guard_install once. Then:
//   SIGBUS on a registered mapping: "error: 'PATH' changed while in use: N bytes now, M when it
//     was opened ...", the partial output removed, exit status 1 (SIGBUS elsewhere stays a crash);
//   SIGINT, SIGTERM, SIGHUP (when asked for): the partial output removed, a line saying so, and
//     the default action (exit status 128 + signal).
#ifndef GUARD_H
#define GUARD_H

#include <stddef.h>

void guard_map(const void *addr, size_t len, const char *path); // path is copied
void guard_unmap(const void *addr);
void guard_output(const char *path); // the file being written (copied); NULL when there is none
void guard_install(int interrupts);

// Around one write that a signal may cut short (a session, in a program that did not ask for
// guard_install(1)): SIGINT, SIGTERM and SIGHUP, unless ignored, remove path (copied) and then
// take the course they had before (the program's handler, or the default end, which a line on
// stderr then explains). guard_output_end restores the handlers and returns 1 when a signal came
// (path is gone then), else 0.
void guard_output_begin(const char *path);
int guard_output_end(void);

#endif
