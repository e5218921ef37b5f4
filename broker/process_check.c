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
 *     has usually exited and its mappings with it. Beyond this check: a
 *     process that ends its session and keeps running (and mapping), and an
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
 * 17) instead of every request. */
#include <errno.h>
#include <inttypes.h>

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

/* Sets what the audit found of s (logging when it starts). */
static void set_audited(gm_session_t *s, uint64_t found) {
        gm_broker_t *b = s->broker;
        uint64_t was = s->audited_bytes;
        if (found == was)
                return;
        s->tenant->audited_bytes = s->tenant->audited_bytes - was + found;
        b->audited_bytes = b->audited_bytes - was + found;
        s->audited_bytes = found;
        if (was != 0)
                return;
        char held[32];
        s->tenant->audit_catches++;
        gm_host_log(b, LOG_WARNING,
                    "session %" PRIu64 " (pid %d, tenant '%s') maps %s of the memory it gave back (its process's "
                    "driver figure grew by it after the release): charged to the tenant as audited until it lets "
                    "go of it",
                    s->id, (int) s->pid, s->tenant->name, gm_format_size(found, held, sizeof(held)));
}

/* What other sessions of s's process hold beyond what the daemon maps into
 * it: released unverified (not counted as mapped), or already audited. */
static uint64_t others_beyond(const gm_broker_t *b, const gm_session_t *s) {
        uint64_t n = 0;
        for (const gm_session_t *o = b->sessions; o; o = o->next)
                if (o->pid == s->pid && !o->ended)
                        n += o->release_unverified_bytes + (o == s ? 0 : o->audited_bytes);
        return n;
}

/* One audit of s: its process's memory beyond the daemon's and its own
 * reference, up to what it gave back. */
static void audit(gm_session_t *s, uint64_t now_ms) {
        gm_broker_t *b = s->broker;
        uint64_t figure;
        s->audited_ms = now_ms;
        b->audit_checks++;
        if (!process_figure(b, s->pid, &figure))
                return; /* no answer this time: what the last one found stands */
        int64_t excess = (int64_t) figure - (int64_t) mapped_into(b, s->pid, NULL, NULL) - s->audit_base -
                         (int64_t) others_beyond(b, s);
        set_audited(s, excess <= 0 ? 0 : (uint64_t) excess < s->audit_released ? (uint64_t) excess : s->audit_released);
}

/* Whether s is to be audited now. */
static bool audit_due(gm_session_t *s, uint64_t now_ms, uint32_t interval_ms) {
        if (s->ended || !s->tenant || !s->audit_based || s->audit_released == 0)
                return false;
        if (gm_tenant_release_check(s->broker, s->tenant) == GM_RELEASE_CHECK_TRUST) {
                set_audited(s, 0); /* its word is taken now */
                return false;
        }
        return now_ms >= s->audited_ms + interval_ms;
}

void gm_process_check_audit_tick(gm_broker_t *b, uint64_t now_ms) {
        uint32_t interval_ms = b->limits.audit_interval_ms;
        if (interval_ms == 0 || !b->driver_attributes_mappings)
                return; /* without that, a figure shows no mapping at all */
        for (unsigned n = 0; n < GM_AUDIT_SESSIONS_PER_TICK; n++) {
                gm_session_t *due = NULL;
                for (gm_session_t *s = b->sessions; s; s = s->next)
                        if (audit_due(s, now_ms, interval_ms) && (!due || s->audited_ms < due->audited_ms))
                                due = s;
                if (!due)
                        return;
                audit(due, now_ms);
        }
}

void gm_process_check_forget(gm_session_t *s) {
        gm_broker_t *b = s->broker;
        if (s->tenant)
                s->tenant->audited_bytes -= s->audited_bytes;
        b->audited_bytes -= s->audited_bytes;
        s->audited_bytes = 0;
}
