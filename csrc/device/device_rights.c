/* device_rights.c -- the rights rule, written once: what a participant may do
 * in a space (resolved rights) and the access check every admission, read and
 * memory read makes with it.  Lower layer (device_internal.h): lookups only. */
#include "device_internal.h"

/* Spec "Scope": an explicit member row replaces the implicit rights (owner:
 * read|write|manage; instance space: read|write for every registered
 * participant; room and private: nothing). A zero-rights row blocks both. */
uint8_t dev_resolved_rights(const aotx_device *d, uint32_t space, uint32_t participant) {
    if (space == DEV_NONE || participant == DEV_NONE) return 0;
    uint32_t row = dev_find_member_row(d, space, d->participants[participant].key);
    if (row != DEV_NONE) return d->members[row].rights;
    const dev_space *s = &d->spaces[space];
    if (s->owner == participant) return AOTX_RIGHT_READ | AOTX_RIGHT_WRITE | AOTX_RIGHT_MANAGE;
    if (s->scope == AOTX_SCOPE_INSTANCE) return AOTX_RIGHT_READ | AOTX_RIGHT_WRITE;
    return 0;
}

/* Space lookup for an action needing `need` (effective = resolved & grants):
 * invisible (no resolved right) -> not found; visible but lacking -> forbidden. */
int dev_space_access(const aotx_device *d, uint32_t grants, uint32_t actor, uint32_t space,
                     uint8_t need, int not_found) {
    if (space == DEV_NONE) return not_found;
    uint8_t resolved = dev_resolved_rights(d, space, actor);
    if (resolved == 0) return not_found;
    if ((resolved & grants & need) != need) return AOTX_E_FORBIDDEN;
    return AOTX_OK;
}

/* The space a reader names, after the grant and read-right checks every space
 * read makes (hidden spaces are space_not_found). */
int dev_space_for_read(const aotx_device *d, uint32_t grants, const uint8_t actor[16],
                       const uint8_t space[16], uint32_t *out) {
    if (!(grants & AOTX_GRANT_READ)) return AOTX_E_GRANT_FORBIDDEN;
    uint32_t me = dev_find_participant(d, actor);
    *out = dev_find_space(d, space);
    return dev_space_access(d, grants, me, *out, AOTX_RIGHT_READ, AOTX_E_SPACE_NOT_FOUND);
}
