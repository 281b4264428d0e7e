"""Writes tests/data/support_tickets.jsonl: 800 short, labelled customer-support messages, the kind of
corpus a new user brings (issue 15): {"id", "category", "text"}, 10 to 60 words each, four unbalanced
classes (about 40/31/19/10 %), 12 resubmitted tickets (exact duplicates under new ids) and 8 edited
ones (near duplicates). Deterministic:
``python tests/data/make_support_tickets.py`` rewrites the same bytes.
"""

import json
import random
from pathlib import Path

OPEN = [
    "Hello,",
    "Hi team,",
    "Good morning,",
    "Hey there,",
    "Dear support,",
    "Hi,",
    "Hello again,",
    "Quick question:",
    "Not happy.",
    "Thanks for reading this.",
]
CLOSE = [
    "Thanks in advance.",
    "Please help.",
    "Can someone get back to me today?",
    "Regards, {name}.",
    "I have been a customer for {years} years.",
    "This is the second time I write about it.",
    "A quick answer would be great.",
    "Cheers, {name}",
    "Let me know what you need from me.",
    "",
]
ISSUES = {
    "billing": [
        "I was charged {amount} twice for order {order}.",
        "My invoice for {month} shows {amount} but my plan costs less.",
        "The refund of {amount} for order {order} has not reached my card after {days} days.",
        "Why did my subscription renew on {month} {day} when I cancelled it?",
        "I need a VAT invoice for order {order} with my company name on it.",
        "The discount code {code} was not applied and I paid {amount}.",
        "My bank says the payment of {amount} was declined but the money is gone.",
        "Please switch my billing from monthly to yearly from {month} on.",
        "There is a charge of {amount} I do not recognise on my statement.",
        "Can I pay the outstanding {amount} in two parts?",
    ],
    "shipping": [
        "Order {order} still says processing after {days} days.",
        "The parcel for order {order} arrived with a broken box.",
        "Tracking for {order} has not moved since {month} {day}.",
        "I got the wrong colour of the {product} in order {order}.",
        "Can you ship order {order} to my office address instead?",
        "The courier left my {product} at the wrong door.",
        "Half of order {order} is missing, only the {product} came.",
        "Delivery was promised for {month} {day} and nothing came.",
        "Do you deliver to {city} and how long does it take?",
        "The {product} I ordered was sent to {city} by mistake.",
    ],
    "technical": [
        "The app crashes when I open the {product} settings page.",
        "I cannot connect the {product} to my wifi since the update.",
        "The {product} shows error code {code} after {days} days of use.",
        "Firmware update {version} fails at ninety percent.",
        "The battery of my {product} drains within {days} hours.",
        "Sync between the {product} and the app stopped working.",
        "The screen of the {product} flickers when it is cold.",
        "After reset the {product} keeps asking for a pin.",
        "The export to PDF gives a blank page in version {version}.",
        "Bluetooth pairing with the {product} drops every few minutes.",
    ],
    "account": [
        "I cannot log in, the reset email never arrives.",
        "Please delete my account and all my data.",
        "How do I change the email address on my account to {email}?",
        "Someone logged into my account from {city}.",
        "My two factor code is rejected every time.",
        "I want to merge my two accounts, {email} and my old one.",
        "The account page says my name is misspelled and I cannot edit it.",
        "Please unlock my account, it was locked after {days} tries.",
    ],
}
COUNTS = {"billing": 312, "shipping": 244, "technical": 146, "account": 78}  # + 20 resubmitted = 800
DETAIL = [
    "I attached a screenshot.",
    "My customer number is {customer}.",
    "I already tried restarting everything.",
    "Your chat bot could not help.",
    "I called on {month} {day} but nobody answered.",
    "The order was a gift.",
    "This is urgent because I travel on {month} {day}.",
    "",
    "",
    "",
]
SLOTS = {
    "amount": lambda r: f"{r.randint(5, 400)}.{r.randint(0, 99):02d} EUR",
    "order": lambda r: f"#{r.randint(10000, 99999)}",
    "month": lambda r: r.choice(
        [
            "January",
            "February",
            "March",
            "April",
            "May",
            "June",
            "July",
            "August",
            "September",
            "October",
            "November",
            "December",
        ]
    ),
    "day": lambda r: str(r.randint(1, 28)),
    "days": lambda r: str(r.randint(2, 30)),
    "code": lambda r: r.choice(["SPRING", "WELCOME", "E-", "X"]) + str(r.randint(10, 999)),
    "product": lambda r: r.choice(["speaker", "smart lamp", "thermostat", "headphones", "camera", "router", "watch"]),
    "city": lambda r: r.choice(["Lyon", "Leeds", "Porto", "Graz", "Turku", "Gdansk", "Bilbao"]),
    "version": lambda r: f"{r.randint(1, 5)}.{r.randint(0, 20)}.{r.randint(0, 9)}",
    "email": lambda r: f"{r.choice(['anna', 'ben', 'chloe', 'dev', 'eli'])}{r.randint(1, 99)}@example.org",
    "name": lambda r: r.choice(["Anna", "Ben", "Chloe", "Dev", "Eli", "Farah", "Goran"]),
    "years": lambda r: str(r.randint(2, 12)),
    "customer": lambda r: f"C{r.randint(100000, 999999)}",
}


def fill(template: str, r: random.Random) -> str:
    return template.format(**{k: f(r) for k, f in SLOTS.items() if "{" + k + "}" in template})


def tickets(seed: int = 15) -> list[dict]:
    r = random.Random(seed)
    out = []
    for category, n in COUNTS.items():
        for _ in range(n):
            parts = [
                r.choice(OPEN),
                fill(r.choice(ISSUES[category]), r),
                fill(r.choice(DETAIL), r),
                fill(r.choice(ISSUES[category]), r) if r.random() < 0.3 else "",
                fill(r.choice(CLOSE), r),
            ]
            out.append({"category": category, "text": " ".join(p for p in parts if p)})
    r.shuffle(out)
    for i in r.sample(range(len(out)), 12):  # resubmitted: the same text again, later, under its own id
        out.append(dict(out[i]))
    for i in r.sample(range(len(out) - 12), 8):  # edited and sent again: one more sentence
        out.append({**out[i], "text": out[i]["text"] + " Any update?"})
    return [{"id": f"T{k + 1:04d}", **rec} for k, rec in enumerate(out)]


if __name__ == "__main__":
    path = Path(__file__).with_name("support_tickets.jsonl")
    path.write_text("".join(json.dumps(t, ensure_ascii=False) + "\n" for t in tickets()))
