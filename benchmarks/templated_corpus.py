"""A templated corpus with known truth for near-duplicate removal (issue 45), generated deterministically.

Documents are support tickets, product listings and help-center answers from a few templates whose fixed
text is most of every document; the slots (customer, order number, product, city, a problem sentence with
twelve words of details, a resolution sentence) vary, so two documents of one template share much of their text without being
copies of each other: their word 5-gram Jaccard similarity is mostly 0.4-0.65, enough for MinHash-LSH
(14 bands of 8 rows) to make some of them candidates and connected components to chain them. Some
documents get planted near copies (a few words changed, a line added or the text re-flowed), which are
the true duplicates: a group is a document and its copies.

Scoring (:func:`score`): a removal is correct when another member of the removed document's group is
kept (its text survives); precision = correct removals / removals; recall = correct removals / the
copies that could be removed (group size - 1, summed over groups).
"""

from __future__ import annotations

import random
import textwrap

import polars as pl

FIRST = "Alice Bruno Chen Dana Emeka Farah Goran Hana Ivan Jonas Kemal Lena Mateo Nadia Omar Priya".split()
LAST = "Smith Novak Okafor Rossi Tanaka Silva Weber Kowalski Haddad Larsen Moreau Yilmaz".split()
PRODUCTS = "router thermostat headset keyboard monitor blender scooter camera printer speaker".split()
CITIES = "Lisbon Austin Leeds Osaka Lagos Krakow Denver Porto Graz Turin Quito Perth".split()
PROBLEMS = [
    "the device stopped charging after the latest firmware update was installed overnight",
    "the screen flickers whenever the brightness is set above half of its range",
    "the package arrived with a cracked corner and the manual was missing entirely",
    "the unit makes a loud clicking noise every few minutes even when it is idle",
    "the mobile app cannot find the device although both are on the same network",
    "the battery drains within two hours although the box promises a full day of use",
    "the left side stopped working and resetting it to factory settings did not help",
    "the order was charged twice on my card and only one confirmation email came",
    "the replacement part that was sent does not fit the model I bought last spring",
    "the colour of the item is different from the one shown on the product page",
    "the delivery was marked as completed but nothing was left at my front door",
    "the warranty registration form rejects the serial number printed on the label",
]
RESOLUTIONS = [
    "we have issued a prepaid return label and a replacement will ship within five days",
    "a technician will call you tomorrow morning to walk through a remote diagnosis",
    "the duplicate charge has been reversed and should appear on your statement soon",
    "please install version four point two of the firmware which fixes this behaviour",
    "we have escalated the case to the carrier and opened an investigation with them",
    "a full refund has been approved and will be credited to the original payment method",
    "the missing manual is attached to this message as a printable document",
    "we have extended your warranty by six months as an apology for the trouble",
]

TEMPLATES = [
    (
        "Ticket {order}. Customer {name} from {city} wrote to us about the {product}: {problem}. "
        "Thank you for contacting customer support. We are sorry to hear about the trouble with your order "
        "and we appreciate the detailed description of the issue. Our records show the purchase and the "
        "shipping address on file. Resolution: {resolution}. If you have any further questions please reply "
        "to this message and keep the ticket number in the subject line so that we can find your case quickly. "
        "Kind regards, the customer support team."
    ),
    (
        "Product listing {order}: refurbished {product}, tested and cleaned, ships from our warehouse in {city}. "
        "Seller note from {name}: {problem}, which has since been repaired and checked twice. Every refurbished "
        "item comes with a one year limited warranty, a new power cable and the original accessories where "
        "available. Returns are accepted within thirty days of delivery in the original packaging. "
        "Buyer protection: {resolution}. Questions about this listing are answered within one business day."
    ),
    (
        "Help center article {order}. Question asked by {name} in {city}: what should I do when {problem}? "
        "Answer: first unplug the {product} for at least thirty seconds, then connect it again and wait until "
        "the status light turns green. Make sure that the cable is not damaged and that the outlet works with "
        "another device. If the problem continues, contact us through the support form. {resolution}. "
        "Was this article helpful? Let us know so that we can improve our documentation."
    ),
]


WORDS = (
    "account address adapter alarm angle answer app area arm audio backup badge band base battery beam bell belt "
    "bill blade board bolt box bracket brand bridge bulb button cable cap card case cell chain channel charge chip "
    "circuit clamp clip clock code coil colour cord cover crack cycle dial disc display dock door drive edge error "
    "fan file film filter flag flash frame fuse gasket gear glass grid grip handle hinge hook horn icon input jack "
    "key knob label lamp latch layer lead lens level lever light limit line link lock loop magnet manual mesh meter "
    "mode motor mount net node nozzle nut option outlet output pad panel part pin pipe plate plug port power "
    "profile pump rail range reading relay ring rotor screen screw seal sensor setting shaft sheet signal slot "
    "socket speed spring stand strap switch tab tank timer tone track tray tube unit valve vent voltage wheel wire"
).split()


def _fill(rng: random.Random, template: str, order: int) -> str:
    details = " ".join(rng.choice(WORDS) for _ in range(12))
    return template.format(
        order=f"#{order:06d}",
        name=f"{rng.choice(FIRST)} {rng.choice(LAST)}",
        city=rng.choice(CITIES),
        product=rng.choice(PRODUCTS),
        problem=f"{rng.choice(PROBLEMS)} (details: {details})",
        resolution=rng.choice(RESOLUTIONS),
    )


def _near_copy(rng: random.Random, text: str) -> str:
    """A planted near copy: a few words changed, a line appended, or the text re-flowed."""
    kind = rng.randrange(3)
    if kind == 0:
        words = text.split(" ")
        for i in rng.sample(range(len(words)), 2):
            words[i] = words[i].upper() if rng.random() < 0.5 else words[i] + "s"
        return " ".join(words)
    if kind == 1:
        return text + "\nSent from my phone, please excuse any typos."
    return textwrap.fill(text, width=rng.choice([40, 60, 72]))


def build(documents: int = 2000, copied: float = 0.1, seed: int = 45) -> tuple[pl.DataFrame, dict[str, int]]:
    """``documents`` template documents plus near copies of a ``copied`` share of them (one copy each,
    one in five with a second copy), in a seeded shuffled order. Returns (doc_id, source, text) and the
    truth: doc_id -> group (the index of the original document)."""
    rng = random.Random(seed)
    rows, group = [], {}
    for i in range(documents):
        t = i % len(TEMPLATES)
        text = _fill(rng, TEMPLATES[t], 1000 + i)
        rows.append((f"doc{i:05d}", f"template{t}/doc{i:05d}.txt", text))
        group[f"doc{i:05d}"] = i
        if rng.random() < copied:
            for c in range(1 + (rng.random() < 0.2)):
                cid = f"doc{i:05d}-copy{c}"
                rows.append((cid, f"template{t}/{cid}.txt", _near_copy(rng, text)))
                group[cid] = i
    rng.shuffle(rows)
    return pl.DataFrame(rows, schema={"doc_id": pl.Utf8, "source": pl.Utf8, "text": pl.Utf8}, orient="row"), group


def score(doc_ids: list[str], removed: set[str], group: dict[str, int]) -> dict:
    """Precision and recall of the removal ``removed`` (doc_ids) against the truth ``group`` (module docstring)."""
    members: dict[int, list[str]] = {}
    for d in doc_ids:
        members.setdefault(group[d], []).append(d)
    correct = sum(1 for d in removed if any(m not in removed for m in members[group[d]]))
    possible = sum(len(m) - 1 for m in members.values())
    return {
        "precision": correct / len(removed) if removed else 1.0,
        "recall": correct / possible if possible else 1.0,
        "removed": len(removed),
        "correct": correct,
        "true_copies": possible,
    }
