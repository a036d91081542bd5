"""The portal's template tags and filters (`{% load portal %}`); the rules are in display.py."""

from datetime import timedelta

from django import template
from django.utils.html import format_html

from runs.queue import idle_holding
from scheduler_project.web.portal import display
from scheduler_project.web.portal.charts import sparkline as draw
from schedules.spread import describe

register = template.Library()


def _prefs(context):
    return display.TimePrefs.of(context.get("request"))


@register.simple_tag(takes_context=True)
def when(context, dt, zone=None, fmt="full"):
    """A time in the zone the person chose (`zone`: the schedule's, used when they chose "the
    schedule's zone"), with its zone, in a <time> element whose title gives it in UTC."""
    if dt is None:
        return "—"
    tz = _prefs(context).zone_for(zone)
    return format_html('<time datetime="{}" title="{}">{}</time>', display.iso_utc(dt),
                       display.format_in(dt, display.UTC, "full"), display.format_in(dt, tz, fmt))


@register.simple_tag
def walltime(dt, zone, fmt="full"):
    """A time as wall time in the given zone, whatever the person chose (a rule's own zone)."""
    if dt is None:
        return "—"
    tz = display.zone(zone) or display.UTC
    return format_html('<time datetime="{}">{}</time>', display.iso_utc(dt), display.format_in(dt, tz, fmt))


@register.simple_tag(takes_context=True)
def display_zone_name(context, zone=None):
    tz = _prefs(context).zone_for(zone)
    return "UTC" if tz is display.UTC else str(tz)


@register.simple_tag(takes_context=True)
def ago(context, dt, now=None):
    if dt is None:
        return "—"
    tz = _prefs(context).zone_for(None)
    return format_html('<time datetime="{}" title="{}">{}</time>', display.iso_utc(dt),
                       display.format_in(dt, tz, "full"), display.ago(dt, now))


@register.filter
def seconds(value):
    return display.duration(value)


@register.filter
def future_note(note):
    return display.future_note(note)


@register.simple_tag
def plural(n, word, many=None):
    return display.plural(n or 0, word, many)


@register.filter
def percent(value):
    if not isinstance(value, (int, float)):
        return "—"
    if value in (0, 1):
        return f"{value * 100:.0f} %"
    return f"{value * 100:.1f} %"


@register.filter
def change_lines(entry):
    # The view marks the entries whose header values the user may see (portal.audit).
    return display.change_lines(entry.before, entry.after, reveal_headers=getattr(entry, "reveal_headers", False))


@register.simple_tag(takes_context=True)
def sparkline(context, figures):
    if not figures:
        return ""
    return draw(figures.outcomes, _prefs(context).zone_for(None))


@register.simple_tag(takes_context=True)
def time_prefs(context):
    return _prefs(context)


@register.filter
def value_text(value):
    """A recorded value as a person reads it: JSON for objects, "—" for none, "(empty)" for ""."""
    return display.value_text(value)


@register.filter
def in_flight_limit(max_in_flight, long=False):
    """A tenant's effective in-flight limit: its explicit cap (across the fleet), or the default
    share of each worker's slots (runs.queue.idle_holding: a worker of the configured size)."""
    if max_in_flight is not None:
        return f"{max_in_flight} across the fleet (set for this tenant)" if long else str(max_in_flight)
    h = idle_holding()
    if long:
        return (f"the default share: {h.tenant_cap} of each worker's {h.slots} slots "
                f"({h.tenant_share:.0%}), {h.host_cap} for its calls to one target host ({h.target_share:.0%})")
    return f"default: {h.tenant_cap} / worker"


@register.filter
def target_limit(max_concurrency):
    """A target prefix's effective budget: its explicit one (across the fleet), or the default
    target share of each worker's slots."""
    return str(max_concurrency) if max_concurrency is not None else f"default: {idle_holding().host_cap} / worker"


@register.simple_tag
def spread_start(dt, offset_seconds, zone, fmt="full"):
    """When an occurrence at `dt` becomes eligible under its schedule's spread offset."""
    if dt is None:
        return "—"
    return walltime(dt + timedelta(seconds=offset_seconds or 0), zone, fmt)


@register.filter
def spread_words(window) -> str:
    """A spread window in words: "10-minute", "90-second"."""
    return describe(int(window or 0))
