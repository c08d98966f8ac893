"""Drives the operator's console in Debian's headless Chromium, one step per line of stdin.

Run by tests/tests/console.rs, which owns the gateway: it sends a step (`login`, `page NAME`,
`create LABEL`, `revoke LABEL`, `reset PROVIDER KEY`, `wait-event TEXT`, `probe`, `phone NAME`,
`count SELECTOR`, `forge-scope SCOPE`, `force-reset PROVIDER KEY`, `csv`, `in-flight PROVIDER COUNT`,
`rotate LABEL`, `toggle Disable|Enable LABEL`, `key-usage LABEL`, `reset-provider PROVIDER`,
`cancel-reset PROVIDER KEY`, `filter-events TYPE PROVIDER KEY`, `event-rows`, `unlabelled`, `keyboard NAME`)
and reads one JSON line back: `{"ok": true, ...}` or `{"ok": false, "error": ...}`, with the
console errors the page logged so far. Playwright drives the system's Chromium
(`executable_path`): no browser is downloaded.

Environment: CONSOLE_URL (the page), CONSOLE_TOKEN (the admin token), CONSOLE_OUT (where the
screenshots go), CHROMIUM (default /usr/bin/chromium).
"""

import json
import os
import sys

from playwright.sync_api import sync_playwright

TIMEOUT_MS = 15_000


def wait_page(page, name):
    page.wait_for_selector(f'#page[data-page="{name}"]', timeout=TIMEOUT_MS)


def go(page, name):
    """Opens a page from the navigation, as an operator would, and waits for its data."""
    page.click(f'nav a[href="#{name}"]')
    wait_page(page, name)
    if name == "events":
        page.wait_for_selector('#event-state[data-live="true"]', timeout=TIMEOUT_MS)


def shot(page, out, name):
    """A full-page screenshot, without the status line (fixed at the window's foot, it would
    cover the page's middle in a picture taller than the window)."""
    path = os.path.join(out, f"{name}.png")
    page.evaluate("document.getElementById('status').style.visibility = 'hidden'")
    page.screenshot(path=path, full_page=True)
    page.evaluate("document.getElementById('status').style.visibility = ''")
    return path


def confirm(page):
    page.wait_for_selector("dialog#confirm[open]", timeout=TIMEOUT_MS)
    page.click("#confirm-yes")


def click_reset(page, provider, key):
    """Resets a key from the pool page, confirming."""
    go(page, "pool")
    page.click(f'button[aria-label="Reset key {provider}/{key}"]')
    confirm(page)


def step(page, out, cmd, args):
    if cmd == "login":
        page.goto(os.environ["CONSOLE_URL"])
        page.fill("#token", os.environ["CONSOLE_TOKEN"])
        page.click("#login-form button[type=submit]")
        wait_page(page, "overview")
        return {"url": page.url}
    if cmd == "page":
        name = args[0]
        go(page, name)
        text = page.inner_text("#page")
        return {"text": text, "screenshot": shot(page, out, name)}
    if cmd == "phone":
        name = args[0]
        page.set_viewport_size({"width": 390, "height": 844})
        go(page, name)
        path = shot(page, out, f"{name}-phone")
        # Nothing wider than the screen but the tables' own scrolling regions.
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        page.set_viewport_size({"width": 1280, "height": 900})
        return {"screenshot": path, "overflow": overflow}
    if cmd == "create":
        label = args[0]
        go(page, "keys")
        page.fill("#key-label", label)
        page.click("#create-key button[type=submit]")
        page.wait_for_selector("#new-secret", timeout=TIMEOUT_MS)
        secret = page.input_value("#new-secret")
        shot(page, out, "keys-created")
        row = page.locator(f'tr:has(span:text-is("{label}"))')
        key_id = row.locator("td").nth(1).inner_text()
        return {"secret": secret, "id": key_id}
    if cmd == "revoke":
        label = args[0]
        go(page, "keys")
        page.click(f'button[aria-label="Revoke {label}"]')
        confirm(page)
        page.wait_for_selector(f'tr:has(span:text-is("{label}")) .badge:text-is("revoked")', timeout=TIMEOUT_MS)
        return {}
    if cmd == "reset":
        provider, key = args
        click_reset(page, provider, key)
        page.wait_for_selector(f'#status:has-text("Reset key {provider}/{key}")', timeout=TIMEOUT_MS)
        return {"status": page.inner_text("#status")}
    if cmd == "wait-event":
        wanted = " ".join(args)
        page.wait_for_selector(f'#event-rows tr:has-text("{wanted}")', timeout=TIMEOUT_MS)
        return {"rows": page.locator("#event-rows tr").count(), "screenshot": shot(page, out, "events")}
    if cmd == "count":
        # How many elements of the current page match a CSS selector.
        return {"count": page.locator(" ".join(args)).count()}
    if cmd == "forge-scope":
        # The page is told the token has another scope (its own whoami answered falsely), as a
        # tampered page would be: the buttons it then shows still go to the real API.
        scope = args[0]
        page.route(
            "**/admin/whoami",
            lambda route: route.fulfill(
                status=200, content_type="application/json", body=json.dumps({"scope": scope, "label": "forged"})
            ),
        )
        page.reload()
        page.wait_for_selector("#page[data-page]", timeout=TIMEOUT_MS)
        return {}
    if cmd == "force-reset":
        click_reset(page, *args)
        page.wait_for_selector("#status.error", timeout=TIMEOUT_MS)
        return {"status": page.inner_text("#status"), "screenshot": shot(page, out, "pool-refused")}
    if cmd == "rotate":
        # Rotates a key from the keys page, confirming; returns the new secret shown once.
        label = args[0]
        go(page, "keys")
        page.click(f'button[aria-label="Rotate {label}"]')
        confirm(page)
        page.wait_for_selector("#new-secret", timeout=TIMEOUT_MS)
        return {"secret": page.input_value("#new-secret")}
    if cmd == "toggle":
        # Disables or enables a key from the keys page (`Disable LABEL` / `Enable LABEL`).
        action, label = args
        go(page, "keys")
        page.click(f'button[aria-label="{action} {label}"]')
        state = "disabled" if action == "Disable" else "enabled"
        page.wait_for_selector(f'tr:has(span:text-is("{label}")) .badge:text-is("{state}")', timeout=TIMEOUT_MS)
        return {}
    if cmd == "key-usage":
        # A key's usage over days, from its Usage button.
        label = args[0]
        go(page, "keys")
        page.click(f'button[aria-label="Usage of {label}"]')
        page.wait_for_selector("#key-usage section", timeout=TIMEOUT_MS)
        return {"text": page.inner_text("#key-usage"), "charts": page.locator("#key-usage svg.chart").count(),
                "screenshot": shot(page, out, "key-usage")}
    if cmd == "reset-provider":
        provider = args[0]
        go(page, "pool")
        page.click(f'button[aria-label="Reset provider {provider}"]')
        confirm(page)
        page.wait_for_selector(f'#status:has-text("Reset provider {provider}")', timeout=TIMEOUT_MS)
        return {"status": page.inner_text("#status")}
    if cmd == "cancel-reset":
        # Opens a key's reset and cancels it with Escape: nothing is sent.
        provider, key = args
        go(page, "pool")
        page.click(f'button[aria-label="Reset key {provider}/{key}"]')
        page.wait_for_selector("dialog#confirm[open]", timeout=TIMEOUT_MS)
        page.keyboard.press("Escape")
        page.wait_for_selector("dialog#confirm[open]", state="detached", timeout=TIMEOUT_MS)
        return {"status": page.inner_text("#status")}
    if cmd == "filter-events":
        # Sets the events page's filter: one type, a provider and a key (`-` for any).
        kind, provider, key = args
        go(page, "events")
        for box in page.locator("#event-filter input[type=checkbox]").all():
            box.set_checked(box.get_attribute("value") == kind)
        page.fill("#ev-provider", "" if provider == "-" else provider)
        page.fill("#ev-key", "" if key == "-" else key)
        page.click("#event-filter button[type=submit]")
        page.wait_for_selector(f'#event-state[data-live="true"]:has-text("Live: {kind}.")', timeout=TIMEOUT_MS)
        return {}
    if cmd == "event-rows":
        # The events page's rows: [time, type, provider, key, details] each.
        rows = page.locator("#event-rows tr")
        return {"rows": [rows.nth(i).locator("td").all_inner_texts() for i in range(rows.count())]}
    if cmd == "unlabelled":
        # The current page's controls a screen reader could not name, or a keyboard not reach.
        return {"controls": page.evaluate(
            """() => [...document.querySelectorAll('input, button, select, textarea, a[href]')]
                .filter((el) => el.offsetParent !== null || el.closest('dialog[open]'))
                .filter((el) => {
                    const label = el.getAttribute('aria-label') || (el.labels && [...el.labels].map((l) => l.textContent).join(' '))
                        || (['BUTTON', 'A'].includes(el.tagName) && el.textContent) || '';
                    return !label.trim() || el.tabIndex < 0;
                })
                .map((el) => el.outerHTML.slice(0, 120))"""
        )}
    if cmd == "keyboard":
        # Opens a page from the navigation with the keyboard alone.
        name = args[0]
        page.focus(f'nav a[href="#{name}"]')
        page.keyboard.press("Enter")
        wait_page(page, name)
        return {"focused": page.evaluate("document.activeElement.id")}
    if cmd == "in-flight":
        # Waits until the pool page (refreshing itself) shows `count` attempts in flight on
        # `provider`'s keys in all; returns the counts per key.
        provider, count = args[0], int(args[1])
        go(page, "pool")
        page.wait_for_function(
            """([provider, count]) => [...document.querySelectorAll('[data-in-flight^="' + provider + '/"]')]
                .reduce((s, e) => s + Number(e.textContent), 0) === count""",
            arg=[provider, count],
            timeout=TIMEOUT_MS,
        )
        cells = page.locator(f'[data-in-flight^="{provider}/"]')
        counts = {cells.nth(i).get_attribute("data-in-flight"): cells.nth(i).inner_text() for i in range(cells.count())}
        return {"counts": counts, "screenshot": shot(page, out, f"pool-in-flight-{count}")}
    if cmd == "csv":
        # Downloads the usage page's CSV export, as an operator would, and returns its text.
        go(page, "usage")
        with page.expect_download(timeout=TIMEOUT_MS) as download:
            page.click("#export-csv")
        path = os.path.join(out, "usage.csv")
        download.value.save_as(path)
        with open(path, encoding="utf-8") as f:
            return {"csv": f.read(), "name": download.value.suggested_filename}
    if cmd == "probe":
        return page.evaluate(
            """() => ({
                injected: window.__xss === undefined ? null : String(window.__xss),
                scripts: document.scripts.length,
                token_in_url: location.href.includes(sessionStorage.getItem('ai-router.adminToken')),
                cookies: document.cookie,
            })"""
        )
    raise ValueError(f"unknown step {cmd}")


def main():
    out = os.environ["CONSOLE_OUT"]
    os.makedirs(out, exist_ok=True)
    errors = []
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=os.environ.get("CHROMIUM", "/usr/bin/chromium"),
            # Root in a container: Chromium's sandbox needs user namespaces it may not have.
            args=["--no-sandbox", "--disable-dev-shm-usage"],
        )
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))
        for line in sys.stdin:
            words = line.split()
            if not words:
                continue
            try:
                reply = {"ok": True, **step(page, out, words[0], words[1:])}
            except Exception as e:  # the Rust side prints it with the step
                try:
                    shot(page, out, f"failed-{words[0]}")
                except Exception:
                    pass
                reply = {"ok": False, "error": repr(e)}
            reply["errors"] = list(errors)
            print(json.dumps(reply), flush=True)
        browser.close()


if __name__ == "__main__":
    main()
