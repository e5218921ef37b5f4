/* Whether memory a client gave back (a ReleaseAck, or a local session's
 * ReturnPieces) is no longer mapped, and what its charge does meanwhile.
 *
 * The host backend answers per piece (session.c, session_local.c ask it first). On
 * cuda nobody can see who maps an exported handle, but NVML reports each
 * process's device memory. That figure covers more than the daemon's memory
 * (the process's context, its own allocations, other sessions of the same
 * process), so changes are compared: a reference is noted, the figure less
 * the bytes the daemon has handed to the sessions of that pid; when memory
 * comes back the same difference has grown by all the returned bytes if the
 * client kept them, and by none if it let go. Central: when a release is
 * first asked for. Local: when the client announces a give-back
 * (ReturnIntent, session_local.c), before it unmaps anything, so the process's own
 * allocations since its last return do not count; it stands until the
 * give-back's closing ReturnPieces, renewed by neither a Reclaim nor another
 * intent: pieces an honest client unmapped but has not returned yet lower
 * the difference, and a reference noted then would make that return look
 * kept. A client that never announces (an older one) has its reference
 * noted at its first Grant and when a Reclaim is sent; one that announces
 * and never closes only hurts itself (its later returns are judged against
 * that old reference). For the same reason, while any give-back of the same
 * pid is under way (a release asked and not acknowledged, an open intent), a
 * new reference is that give-back's, not a new reading. The verdict:
 *   - gone: it did not grow at all: the charge ends at once. That drop also
 *     shows that this driver attributes mapped memory to the process mapping
 *     it (kept memory is taken as a lie only after one such confirmation, by
 *     any session: with a driver that does not, every client would look
 *     like one); a growth under half of the returned bytes confirms it too;
 *   - kept: it grew by all of them, the driver counting mappings, and by
 *     more than what was handed to the process just before the reference
 *     (maybe not mapped when the figure was read): a lie; the caller closes
 *     the session and the memory stays charged while the driver lists the
 *     process (piece.c);
 *   - unverified: anything else (no NVML, no per-process figure, no
 *     reference, attribution not yet confirmed, part of it kept, or the
 *     process's own allocations meanwhile): the client's word is not taken;
 *     the memory stays charged (tenant, quota, the device's in-use count) and
 *     held here (its handle kept) until the session ends, when its process
 *     has usually exited and its mappings with it (one that keeps running
 *     and mapping is audited after the end, below). Beyond this check: an
 *     fd passed to another process.
 * A release held unverified stays held when a later one confirms
 * attribution: its own acknowledgement showed no drop, which from then on
 * reads as kept, not as honest.
 *
 * A tenant's release_check = trust takes its clients' word where the
 * verdict would be unverified: released at once (a figure that shows the
 * memory kept is still a lie).
 *
 * The audit: a verdict of gone is right at that instant only: a client that
 * unmapped, kept the fds and returned them can import and map them again
 * later. So every session with memory released on its figure's word is
 * audited again on the tick (at most GM_AUDIT_SESSIONS_PER_TICK a tick, the
 * one audited longest ago first, each every audit_interval_ms): its
 * process's figure less the daemon's memory it maps is compared with the
 * lowest reference of its believed releases (its own memory then: context,
 * its own allocations). What exceeds it, up to the bytes it gave back, is
 * memory it may have taken again: charged to its tenant as audited bytes,
 * one log line and a counter. Audited bytes count against the quota and the
 * device like charged ones, so the tenant's requests are refused while they
 * put it over its quota (the refusal names them) and no other tenant is
 * granted the memory still live; the next audit that finds the excess gone
 * lifts it. A process that allocates device memory of its own after a
 * give-back is charged for it the same way (up to what it gave back): the
 * figure cannot tell the two apart, which is why the charge refuses only
 * past the quota (an honest process's own allocations are no lie, issue
 * 17) instead of every request.
 *
 * One figure a process: all the sessions of a pid are audited together
 * (one query), its excess over the lowest of their references shared out
 * once among them, each up to what it gave back, never once per session.
 *
 * After the session: a process may end its session (close its connection)
 * and keep mapping what it was handed; the daemon releases its handles then.
 * So at a session's end its process's figure is read once more (s no longer
 * counts as live): beyond its baseline (its own memory before the session's
 * first hand-out, or a lower reference of its give-backs) and what the
 * daemon accounts for in it (its other live sessions, lingering memory,
 * holds), it is followed (gm_audited_process_t): audited with its other
 * sessions, charged as audited up to what the session was handed or gave
 * back, until the driver lists it with no memory (it exited). An honest
 * client unmapped before it closed (libgpumem's disconnect) and a killed
 * one's mappings are gone, so neither is followed. Its limits: device memory
 * a process allocated itself after that first hand-out reads as kept (up to
 * what it was handed), as in the audit above; a pid reused within one audit
 * interval of its process's exit is charged to the old tenant until that
 * audit; at most limits.max_audited_processes are followed, the oldest
 * dropped (logged), and a process dropped that way, or one that held nothing
 * at all (no context) at an audit and maps again later, is not. */
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>

#include "piece.h"
#include "size.h"

/* The driver's figure for pid; false when it cannot tell. */
static bool process_figure(const gm_broker_t *b, pid_t pid, uint64_t *ret_bytes) {
        const gm_backend_ops_t *ops = b->backend->ops;
        return !ops->mapped && ops->process_bytes && pid > 0 &&
               ops->process_bytes(b->backend, (int) pid, ret_bytes) == 0;
}

/* How long after a hand-out its client may still be about to map it. */
#define HANDOUT_SETTLE_MS 1000

/* Bytes the daemon has handed to the sessions of pid (sent or granted) and
 * not had back. Memory held on the client's word counts as not mapped, as
 * the client said: a local reference noted before such a hold then still
 * matches an honest process (a liar's kept memory only grows its figure).
 * ret_in_flight, if given: of those, the live ones handed out less than
 * HANDOUT_SETTLE_MS ago, which the figure may not show yet (a reply on its
 * way), but for those of `settled` (a local session: its heap maps a Grant's
 * pieces before it can announce a give-back); pieces being given back were
 * mapped, or their blocks would not have been freed. Shared objects its
 * sessions map count too (shared.c). */
static uint64_t mapped_into(const gm_broker_t *b, pid_t pid, const gm_session_t *settled, uint64_t *ret_in_flight) {
        uint64_t n = 0, in_flight = 0, now_ms = ret_in_flight ? gm_now_ms() : 0;
        for (const gm_session_t *s = b->sessions; s; s = s->next)
                if (s->pid == pid && !s->ended)
                        for (const gm_piece_t *p = s->pieces; p; p = p->next)
                                if ((p->sent || p->granted) && !p->unverified) {
                                        n += p->phys.size;
                                        if (s != settled && p->state == GM_PIECE_LIVE &&
                                            now_ms < p->handed_ms + HANDOUT_SETTLE_MS)
                                                in_flight += p->phys.size;
                                }
        for (const gm_session_t *s = b->sessions; s; s = s->next)
                if (s->pid == pid && !s->ended) { /* the shared objects it maps: the daemon's memory too */
                        uint64_t recent;
                        n += gm_shared_mapped(s, now_ms, HANDOUT_SETTLE_MS, &recent);
                        in_flight += recent;
                }
        if (ret_in_flight)
                *ret_in_flight = in_flight;
        return n;
}

/* The note of a give-back of pid's memory under way (a release asked and not
 * acknowledged, or a local give-back announced by its ReturnIntent), if any:
 * its client may have unmapped already, so the figure now is below what the
 * daemon still books as mapped, and a note taken now would make the next
 * honest acknowledgement look kept. That note, taken before, still holds. */
static const gm_holder_note_t *note_under_way(const gm_broker_t *b, pid_t pid) {
        for (const gm_session_t *s = b->sessions; s; s = s->next) {
                if (s->pid != pid || s->ended)
                        continue;
                if (s->return_intent_open)
                        return &s->holder;
                for (const gm_release_t *rel = s->releases; rel; rel = rel->next)
                        if (!rel->held && rel->attempts > 0)
                                return &rel->holder;
        }
        return NULL;
}

void gm_process_check_note(gm_session_t *s, gm_holder_note_t *ret) {
        uint64_t figure;
        const gm_holder_note_t *under_way = note_under_way(s->broker, s->pid);
        if (under_way) {
                *ret = *under_way;
                return;
        }
        *ret = (gm_holder_note_t){0};
        if (!process_figure(s->broker, s->pid, &figure))
                return;
        ret->noted = true;
        ret->unaccounted =
                (int64_t) figure - (int64_t) mapped_into(s->broker, s->pid, s->local ? s : NULL, &ret->in_flight);
}

/* A release believed on the figure's word: what the audit checks it against
 * later. The reference never rises: memory the process took again before a
 * later reference would otherwise count as its own. */
static void audit_note_release(gm_session_t *s, const gm_holder_note_t *note, uint64_t released) {
        int64_t base = note->unaccounted - (int64_t) s->audited_bytes;
        if (!s->audit_based || base < s->audit_base)
                s->audit_base = base;
        s->audit_based = true;
        s->audit_released += released;
}

/* The verdict of the figure alone. */
static gm_release_verdict_t figure_verdict(gm_session_t *s, const gm_holder_note_t *note, uint64_t acknowledged) {
        gm_broker_t *b = s->broker;
        uint64_t figure;
        if (acknowledged == 0)
                return GM_RELEASE_GONE;
        if (!note->noted || !process_figure(b, s->pid, &figure))
                return GM_RELEASE_UNVERIFIED;
        /* The acknowledged pieces are still listed (they are freed after this). */
        int64_t unaccounted =
                (int64_t) figure - ((int64_t) mapped_into(b, s->pid, NULL, NULL) - (int64_t) acknowledged);
        int64_t growth = unaccounted - note->unaccounted;
        if (growth < (int64_t) (acknowledged / 2))
                b->driver_attributes_mappings = true; /* the memory left the process's figure */
        if (growth <= 0) {
                audit_note_release(s, note, acknowledged);
                return GM_RELEASE_GONE;
        }
        /* Memory in flight at the note may have been mapped since: only the
         * growth beyond it can be a lie (short of that: held, not closed). */
        if (b->driver_attributes_mappings && growth >= (int64_t) (acknowledged + note->in_flight))
                return GM_RELEASE_KEPT;
        return GM_RELEASE_UNVERIFIED;
}

gm_release_verdict_t gm_process_check_verdict(gm_session_t *s, const gm_holder_note_t *note, uint64_t acknowledged) {
        gm_release_verdict_t verdict = figure_verdict(s, note, acknowledged);
        if (verdict == GM_RELEASE_UNVERIFIED && gm_tenant_release_check(s->broker, s->tenant) == GM_RELEASE_CHECK_TRUST)
                return GM_RELEASE_GONE; /* the operator takes its clients' word */
        return verdict;
}

bool gm_process_check_needs_intent(const gm_session_t *s) {
        uint64_t figure;
        return process_figure(s->broker, s->pid, &figure);
}

bool gm_process_check_holds_memory(const gm_broker_t *b, pid_t pid) {
        uint64_t figure;
        return b->driver_attributes_mappings && process_figure(b, pid, &figure) && figure > 0;
}

/* ---- the audit ---- */

/* Sets what the audit found of a session or an ended process (*audited,
 * charged to tenant t); true when it starts (the caller logs it). */
static bool set_found(gm_broker_t *b, gm_tenant_t *t, uint64_t *audited, uint64_t found) {
        uint64_t was = *audited;
        if (found == was)
                return false;
        t->audited_bytes = t->audited_bytes - was + found;
        b->audited_bytes = b->audited_bytes - was + found;
        *audited = found;
        if (was != 0)
                return false;
        t->audit_catches++;
        return true;
}

/* Sets what the audit found of s (logging when it starts). */
static void set_audited(gm_session_t *s, uint64_t found) {
        char held[32];
        if (set_found(s->broker, s->tenant, &s->audited_bytes, found))
                gm_host_log(s->broker, LOG_WARNING,
                            "session %" PRIu64 " (pid %d, tenant '%s') maps %s of the memory it gave back (its "
                            "process's driver figure grew by it after the release): charged to the tenant as audited "
                            "until it lets go of it",
                            s->id, (int) s->pid, s->tenant->name, gm_format_size(found, held, sizeof(held)));
}

/* Sets what the audit found of an ended process (logging when it starts). */
static void set_audited_ended(gm_broker_t *b, gm_audited_process_t *a, uint64_t found) {
        char held[32];
        if (set_found(b, a->tenant, &a->audited_bytes, found))
                gm_host_log(b, LOG_WARNING,
                            "pid %d (tenant '%s') still maps %s of gpumemd's memory after its session ended (its "
                            "driver figure): charged to the tenant as audited until it lets go of it or exits",
                            (int) a->pid, a->tenant->name, gm_format_size(found, held, sizeof(held)));
}

/* What the daemon accounts for in pid's figure beyond its own memory: what
 * it handed its live sessions, memory lingering charged for it, and what its
 * sessions released unverified (held charged, not counted as mapped). */
static uint64_t accounted_in(const gm_broker_t *b, pid_t pid) {
        uint64_t n = mapped_into(b, pid, NULL, NULL);
        for (const gm_session_t *s = b->sessions; s; s = s->next)
                if (s->pid == pid && !s->ended)
                        n += s->release_unverified_bytes;
        for (const gm_lingering_t *l = b->lingering; l; l = l->next)
                if (l->pid == pid)
                        n += l->phys.size;
        return n;
}

/* Whether s's believed give-backs are audited (clearing what was found of a
 * tenant whose word is now taken). */
static bool audited_session(gm_session_t *s) {
        if (s->ended || !s->tenant || !s->audit_based || s->audit_released == 0)
                return false;
        if (gm_tenant_release_check(s->broker, s->tenant) == GM_RELEASE_CHECK_TRUST) {
                set_audited(s, 0); /* its word is taken now */
                return false;
        }
        return true;
}

/* Unlinks and frees *ap, its charge ended. */
static void drop_ended(gm_broker_t *b, gm_audited_process_t **ap) {
        gm_audited_process_t *a = *ap;
        *ap = a->next;
        set_found(b, a->tenant, &a->audited_bytes, 0);
        b->n_audited_processes--;
        free(a);
}

/* Drops the ended processes followed longest, logged, until at most `keep`
 * are (the bound is max_audited_processes). */
static void drop_oldest_past(gm_broker_t *b, uint32_t keep) {
        while (b->n_audited_processes > keep) {
                gm_audited_process_t **oldest = &b->audited_processes;
                for (gm_audited_process_t **ap = &b->audited_processes; *ap; ap = &(*ap)->next)
                        if ((*ap)->ended_ms < (*oldest)->ended_ms)
                                oldest = ap;
                gm_host_log(b, LOG_WARNING,
                            "pid %d (tenant '%s') is no longer audited after its session ended: more than "
                            "max_audited_processes = %" PRIu32 " ended processes, the oldest dropped",
                            (int) (*oldest)->pid, (*oldest)->tenant->name, b->limits.max_audited_processes);
                drop_ended(b, oldest);
        }
}

/* One audit of pid, one driver figure for all its sessions and its ended
 * ones: its memory beyond what the daemon accounts for and the lowest of
 * their references (its own memory), shared out once, each up to what it
 * gave back (a live session) or was handed (an ended one). The driver
 * listing it with no memory at all ends what is followed of its ended
 * sessions: it exited (or holds nothing, not even a context). */
static void audit(gm_broker_t *b, pid_t pid, uint64_t now_ms) {
        int64_t base = INT64_MAX;
        for (gm_session_t *s = b->sessions; s; s = s->next)
                if (s->pid == pid && audited_session(s)) {
                        s->audited_ms = now_ms;
                        base = s->audit_base < base ? s->audit_base : base;
                }
        for (gm_audited_process_t *a = b->audited_processes; a; a = a->next)
                if (a->pid == pid) {
                        a->audited_ms = now_ms;
                        base = a->base < base ? a->base : base;
                }
        uint64_t figure;
        b->audit_checks++;
        if (!process_figure(b, pid, &figure))
                return; /* no answer this time: what the last one found stands */
        int64_t excess = (int64_t) figure - (int64_t) accounted_in(b, pid) - base;
        uint64_t left = excess > 0 ? (uint64_t) excess : 0, share;
        for (gm_session_t *s = b->sessions; s; s = s->next)
                if (s->pid == pid && audited_session(s)) {
                        share = left < s->audit_released ? left : s->audit_released;
                        set_audited(s, share);
                        left -= share;
                }
        for (gm_audited_process_t **ap = &b->audited_processes; *ap;) {
                gm_audited_process_t *a = *ap;
                if (a->pid != pid) {
                        ap = &a->next;
                        continue;
                }
                if (figure == 0) {
                        gm_host_log(b, LOG_INFO,
                                    "pid %d (tenant '%s') holds no device memory any more: no longer audited",
                                    (int) pid, a->tenant->name);
                        drop_ended(b, ap);
                        continue;
                }
                share = left < a->held ? left : a->held;
                set_audited_ended(b, a, share);
                left -= share;
                ap = &a->next;
        }
}

void gm_process_check_audit_tick(gm_broker_t *b, uint64_t now_ms) {
        uint32_t interval_ms = b->limits.audit_interval_ms;
        if (interval_ms == 0 || !b->driver_attributes_mappings)
                return;                                       /* without that, a figure shows no mapping at all */
        drop_oldest_past(b, b->limits.max_audited_processes); /* the bound may have been lowered */
        for (gm_audited_process_t **ap = &b->audited_processes; *ap;)
                if (gm_tenant_release_check(b, (*ap)->tenant) == GM_RELEASE_CHECK_TRUST)
                        drop_ended(b, ap); /* its word is taken now */
                else
                        ap = &(*ap)->next;
        for (unsigned n = 0; n < GM_AUDIT_SESSIONS_PER_TICK; n++) {
                bool any = false;
                pid_t due = 0;
                uint64_t due_ms = UINT64_MAX;
                for (gm_session_t *s = b->sessions; s; s = s->next)
                        if (audited_session(s) && now_ms >= s->audited_ms + interval_ms && s->audited_ms < due_ms) {
                                any = true;
                                due = s->pid;
                                due_ms = s->audited_ms;
                        }
                for (const gm_audited_process_t *a = b->audited_processes; a; a = a->next)
                        if (now_ms >= a->audited_ms + interval_ms && a->audited_ms < due_ms) {
                                any = true;
                                due = a->pid;
                                due_ms = a->audited_ms;
                        }
                if (!any)
                        return;
                audit(b, due, now_ms);
        }
}

void gm_process_check_baseline(gm_session_t *s, const gm_holder_note_t *fresh) {
        if (s->baseline_tried)
                return;
        s->baseline_tried = true;
        if (fresh && fresh->noted)
                s->baseline = *fresh;
        else
                gm_process_check_note(s, &s->baseline);
}

/* Where an ended session's process is followed: its entry for tenant t
 * (made, the oldest dropped past the bound), or NULL. */
static gm_audited_process_t *ended_entry(gm_broker_t *b, pid_t pid, gm_tenant_t *t) {
        for (gm_audited_process_t *a = b->audited_processes; a; a = a->next)
                if (a->pid == pid && a->tenant == t)
                        return a;
        if (b->limits.max_audited_processes == 0)
                return NULL;
        drop_oldest_past(b, b->limits.max_audited_processes - 1); /* room for one more */
        gm_audited_process_t *a = calloc(1, sizeof(*a));
        if (!a)
                return NULL;
        a->pid = pid;
        a->tenant = t;
        a->base = INT64_MAX;
        a->next = b->audited_processes;
        b->audited_processes = a;
        b->n_audited_processes++;
        return a;
}

/* Whether s's process, its session just ended, still holds memory beyond
 * `base` (its own) and what the daemon accounts for in it (s no longer
 * counts: it is ended). One figure, read only where the audit could follow. */
static bool ended_holds_more(gm_session_t *s, int64_t base) {
        gm_broker_t *b = s->broker;
        uint64_t figure;
        if (b->stopping || b->keep_stored || !b->limits.audit_interval_ms || !b->limits.max_audited_processes ||
            !b->driver_attributes_mappings || gm_tenant_release_check(b, s->tenant) == GM_RELEASE_CHECK_TRUST)
                return false;
        b->audit_checks++;
        return process_figure(b, s->pid, &figure) && (int64_t) figure - (int64_t) accounted_in(b, s->pid) > base;
}

void gm_process_check_end(gm_session_t *s) {
        gm_broker_t *b = s->broker;
        uint64_t held = s->audit_released;
        for (const gm_piece_t *p = s->pieces; p; p = p->next)
                if (p->sent || p->granted)
                        held += p->phys.size;
        /* Its own memory: the lower of its baseline and its give-backs' references. */
        int64_t base = s->baseline.noted ? s->baseline.unaccounted : INT64_MAX;
        if (s->audit_based && s->audit_base < base)
                base = s->audit_base;
        /* An honest client unmapped before it closed its connection
         * (libgpumem's disconnect), a killed one's mappings are gone: neither
         * is followed. */
        gm_audited_process_t *a = NULL;
        if (s->tenant && held > 0 && base != INT64_MAX && ended_holds_more(s, base))
                a = ended_entry(b, s->pid, s->tenant);
        if (a) {
                a->base = base < a->base ? base : a->base;
                a->held += held;
                a->audited_bytes += s->audited_bytes; /* what was found of it stays charged */
                a->audited_ms = 0;                    /* audited at the next tick */
                a->ended_ms = gm_now_ms();
                s->audited_bytes = 0;
        }
        if (s->tenant)
                s->tenant->audited_bytes -= s->audited_bytes;
        b->audited_bytes -= s->audited_bytes;
        s->audited_bytes = 0;
}

void gm_process_check_free_all(gm_broker_t *b) {
        while (b->audited_processes)
                drop_ended(b, &b->audited_processes);
}
