"""
Grade-school word problems with worked solutions: a task with verifiable answers whose outputs are
natural language, for fine-tuning a small instruct model with and without SBD.

    prompt:    "Mia buys 3 notebooks at $4 each. She gets 2 mugs that cost $7 apiece. She hands the
                cashier $50. How much change does she get?"
    response:  "The notebooks cost 3 * 4 = 12 dollars.
                For the mugs: 2 * 7 = 14 dollars.
                Together that is 12 + 14 = 26 dollars.
                That leaves 50 - 26 = 24 dollars.
                #### 24"

Ten families of problems (FAMILIES), each needing 2-4 steps of exact whole-number arithmetic. A
solution has one step per line, each holding one "a op b = c" (op one of + - * /), and ends with the
line "#### <answer>", the GSM8K convention (evaluate.py --answer_marker='####'). The names, the
objects, the prompt's wording, the order of its facts, whether the question comes first or last, and
the wording of every step are drawn at random: SBD's trade-off must be measured on text with real
entropy, not on one template that a model learns to copy.

The split is a hash of a problem's identity: its family, its numbers and the choices that change
its arithmetic, never the names or the wording. So a test problem never appears in train or val
told about someone else. All splits take their problems from one stream drawn by one sampler, each
problem going to the split its hash names, and each split takes the same share of every family: the
splits have the same mix of families and numbers, and the test set is the same whatever the other
splits' sizes. Writes train.jsonl / val.jsonl / test.jsonl, one {"prompt", "response", "answer"}
object per line (the format of train.py's JSONL fine-tuning data and of evaluate.py --benchmark),
and meta.json.

Run: python data/wordproblems/prepare.py [out_dir [n_train n_val n_test]]
     (standard library only, about a second)
"""

import hashlib
import json
import os
import random
import re
import sys
from collections import namedtuple

HERE = os.path.dirname(os.path.abspath(__file__))
TEST_PER_MILLE, VAL_PER_MILLE = 70, 30  # of the hash space: 7% test, 3% val, the other 90% train

Problem = namedtuple("Problem", "family key template prompt response answer")

# -----------------------------------------------------------------------------
# names, nouns as (singular, plural), and grammar

NAMES = [("Mia", "f"), ("Liam", "m"), ("Aisha", "f"), ("Mateo", "m"), ("Priya", "f"),
         ("Kenji", "m"), ("Fatima", "f"), ("Noah", "m"), ("Sofia", "f"), ("Omar", "m"),
         ("Chloe", "f"), ("Diego", "m"), ("Amara", "f"), ("Lucas", "m"), ("Yuki", "f"),
         ("Ravi", "m"), ("Elena", "f"), ("Kwame", "m"), ("Hana", "f"), ("Ethan", "m"),
         ("Leila", "f"), ("Arjun", "m"), ("Zoe", "f"), ("Tomas", "m"), ("Grace", "f"),
         ("Mohammed", "m"), ("Ingrid", "f"), ("Chen", "m"), ("Nadia", "f"), ("Oscar", "m"),
         ("Lucia", "f"), ("Jamal", "m"), ("Ava", "f"), ("Sipho", "m"), ("Mei", "f"),
         ("Daniel", "m")]
PRONOUNS = {"f": dict(S="She", s="she", His="Her", his="her", him="her"),
            "m": dict(S="He", s="he", His="His", his="his", him="him")}
SLOT = re.compile(r"@(His|his|him|S|s)\b")  # where the main person is named or a pronoun stands

DOLLAR, HOUR, WEEK = ("dollar", "dollars"), ("hour", "hours"), ("week", "weeks")
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
THINGS = [("marble", "marbles"), ("cookie", "cookies"), ("sticker", "stickers"),
          ("crayon", "crayons"), ("bead", "beads"), ("shell", "shells"),
          ("strawberry", "strawberries"), ("button", "buttons"), ("stamp", "stamps"),
          ("trading card", "trading cards"), ("acorn", "acorns")]


def count(n, noun):
    """'1 apple', '3 apples': the number and the noun that agrees with it."""
    return f"{n} {noun[0] if n == 1 else noun[1]}"


def fill(text, who):
    """Name the main person at the first of their slots and use pronouns after that, so the name
    comes first whichever sentence a shuffle put first. who = (name, 'f' or 'm')."""
    name, gender = who
    named = False

    def slot(m):
        nonlocal named
        if named:
            return PRONOUNS[gender][m.group(1)]
        named = True
        return name + ("'s" if m.group(1).lower() == "his" else "")
    return SLOT.sub(slot, text)


class Draw:
    """The random choices behind one problem. say() picks a wording of the prompt and records which,
    so that a problem's template (its wording apart from names, nouns and numbers) can be counted;
    step() picks a wording of a solution step. Both fill in the fields of v: numbers, and nouns
    already made to agree with them."""

    def __init__(self, rng):
        self.rng, self.choices, self.v = rng, [], {}
        self.who = rng.choice(NAMES)

    def pick(self, options):
        i = self.rng.randrange(len(options))
        self.choices.append(i)
        return options[i]

    def say(self, options, **fields):
        return self.pick(options).format(**{**self.v, **fields})

    def step(self, options, **fields):
        return self.rng.choice(options).format(**{**self.v, **fields})

    def shuffled(self, sentences):
        """The sentences in a random order (where the facts mean the same in any order)."""
        order = self.rng.sample(range(len(sentences)), len(sentences))
        self.choices.append("".join(map(str, order)))
        return [sentences[i] for i in order]

    def problem(self, family, key, scenes, facts, question, steps, answer):
        """The prompt: a scene-setting sentence (or none), the facts, and the question after them
        or, half the time, before them. Every answer is a positive whole number."""
        assert isinstance(answer, int) and answer > 0, (family, key, answer)
        facts = [s for s in [self.say(scenes + [""])] if s] + facts
        parts = facts + [question] if self.pick(["last", "first"]) == "last" else [question] + facts
        response = "\n".join(steps + [f"#### {answer}"])
        template = family + "/" + ".".join(map(str, self.choices))
        return Problem(family, (family,) + tuple(key), template, fill(" ".join(parts), self.who),
                       fill(response, self.who), str(answer))


# -----------------------------------------------------------------------------
# the families: each draws its numbers, writes the prompt and the worked solution and returns a
# Problem, or None when the numbers it drew make no clean problem (the sampler then draws again)

GOODS = [("notebook", "notebooks"), ("pen", "pens"), ("sandwich", "sandwiches"), ("mug", "mugs"),
         ("candle", "candles"), ("comic book", "comic books"), ("cupcake", "cupcakes"),
         ("bottle of juice", "bottles of juice"), ("scarf", "scarves"), ("toy car", "toy cars"),
         ("ticket", "tickets"), ("packet of seeds", "packets of seeds"),
         ("plant pot", "plant pots"),
         ("box of crayons", "boxes of crayons"), ("pair of socks", "pairs of socks")]
SHOPS = ["the market", "the mall", "a street fair", "the corner store", "the school fair"]


def shopping(d):
    """Two kinds of goods at a price each: the total cost, or the change from a bill. 3-4 steps."""
    rng = d.rng
    (g1, g2), n1, n2 = rng.sample(GOODS, 2), rng.randint(2, 10), rng.randint(2, 10)
    p1, p2 = rng.randint(2, 20), rng.randint(2, 20)
    c1, c2 = n1 * p1, n2 * p2
    total = c1 + c2
    bill = rng.choice([b for b in (20, 50, 100, 200, 500) if b > total][:2])
    d.v.update(c1=c1, c2=c2, total=total, bill=bill, shop=rng.choice(SHOPS),
               change=count(bill - total, DOLLAR), items1=count(n1, g1), items2=count(n2, g2))
    if d.pick(["one sentence", "two sentences"]) == "one sentence":
        facts = [d.say(["@S buys {items1} at ${p1} each and {items2} at ${p2} each.",
                        "At {shop}, @s picks up {items1} for ${p1} apiece and {items2} for ${p2} "
                        "apiece."], p1=p1, p2=p2)]
    else:
        buy = ["@S buys {items} at ${p} each.", "@S picks out {items} for ${p} each.",
               "@S gets {items} that cost ${p} apiece.",
               "At {shop}, @s finds {items} at ${p} each."]
        facts = d.shuffled([d.say(buy, items=d.v["items1"], p=p1),
                            d.say(buy, items=d.v["items2"], p=p2)])
    ask = d.pick(["total", "change"])
    if ask == "change":
        facts.append(d.say(["@S pays with ${bill} in cash.", "@S hands the cashier ${bill}.",
                            "@S pays for everything with ${bill}."]))
        question = d.say(["How much change does @s get?", "How much money does @s get back?",
                          "How many dollars of change should @s receive?",
                          "What change does @s get back?"])
    else:
        question = d.say(["How much does @s spend in all?",
                          "How many dollars does @s pay altogether?",
                          "What is the total cost of @his shopping?", "What does @s spend in all?"])
    cost = ["The {goods} cost {n} * {p} = {c} dollars.",
            "For the {goods}: {n} * {p} = {c} dollars.",
            "@S pays {n} * {p} = {c} dollars for the {goods}.",
            "{n} {goods} at {p} dollars each come to {n} * {p} = {c} dollars."]
    steps = [d.step(cost, goods=g1[1], n=n1, p=p1, c=c1),
             d.step(cost, goods=g2[1], n=n2, p=p2, c=c2),
             d.step(["Together that is {c1} + {c2} = {total} dollars.",
                     "In all @s spends {c1} + {c2} = {total} dollars.",
                     "The total is {c1} + {c2} = {total} dollars."])]
    if ask == "change":
        steps.append(d.step(["The change is {bill} - {total} = {change}.",
                             "@S gets back {bill} - {total} = {change}.",
                             "That leaves {bill} - {total} = {change}."]))
    scenes = ["@S is getting ready for a picnic.", "@S is buying presents for @his family.",
              "@S goes shopping on a Saturday morning."]
    # the two purchases can be told in either order: one problem, so one identity
    key = (ask, *sorted([(n1, p1), (n2, p2)]), bill if ask == "change" else 0)
    answer = bill - total if ask == "change" else total
    return d.problem("shopping", key, scenes, facts, question, steps, answer)


CONTAINERS = [("bag", "bags"), ("box", "boxes"), ("jar", "jars"), ("basket", "baskets"),
              ("tin", "tins")]
SHARERS = [("friend", "friends"), ("classmate", "classmates"), ("cousin", "cousins"),
           ("teammate", "teammates"), ("neighbor", "neighbors")]
SIBLINGS = ["brother", "sister", "cousin", "grandmother", "best friend"]


def sharing(d):
    """Containers of things; some given away or more added; the rest shared equally. 3-4 steps."""
    rng = d.rng
    box, thing, sharer = rng.choice(CONTAINERS), rng.choice(THINGS), rng.choice(SHARERS)
    a, b, k = rng.randint(2, 12), rng.randint(3, 15), rng.randint(2, 9)
    t = a * b
    how = d.pick(["give", "give two", "get"])
    if how == "get":
        gives = [rng.choice([c for c in range(1, 41) if (t + c) % k == 0])]
        rest = t + gives[0]
    else:
        first = [rng.randint(1, 15)] if how == "give two" else []
        options = [c for c in range(1, 41 if how == "give" else 16)
                   if t - sum(first) - c >= k and (t - sum(first) - c) % k == 0]
        if not options:
            return None
        gives = first + [rng.choice(options)]
        rest = t - sum(gives)
    d.v.update(a=a, b=b, k=k, t=t, rest=rest, boxes=box[1], box=box[0], things=thing[1],
               friend=sharer[0], friends=sharer[1], sibling=rng.choice(SIBLINGS),
               each=count(rest // k, thing), c=gives[0], some=count(gives[0], thing),
               other=count(gives[-1], thing))
    facts = [d.say(["@S has {a} {boxes} with {b} {things} in each.",
                    "@S has {a} {boxes}, and each {box} holds {b} {things}.",
                    "There are {b} {things} in each of @his {a} {boxes}."])]
    if how == "get":
        facts += [d.say(["@S buys {some} more.", "@His {sibling} adds {some}.",
                         "Then @s finds {some} more."]),
                  d.say(["@S shares all of them equally among {k} {friends}.",
                         "All of them are then shared equally by {k} {friends}."])]
    else:
        if how == "give":
            facts.append(d.say(["@S gives {some} to @his {sibling}.", "@S gives away {some}.",
                                "@S puts {some} aside for later."]))
        else:
            p2, p3 = (name for name, _ in rng.sample([w for w in NAMES if w != d.who], 2))
            facts.append(d.say(["@S gives {some} to {p2} and {other} to {p3}.",
                                "First @s gives {p2} {some} and {p3} {other}."], p2=p2, p3=p3))
        facts.append(d.say(["@S shares the rest equally among {k} {friends}.",
                            "Then @s splits the rest evenly among {k} {friends}.",
                            "The rest are shared equally by {k} {friends}."]))
    question = d.say(["How many {things} does each {friend} get?",
                      "How many {things} will each {friend} receive?",
                      "How many {things} does each of the {friends} end up with?",
                      "What is each {friend}'s share?"])
    steps = sharing_steps(d, how, gives)
    scenes = ["@S is sorting @his {things}.", "@S is tidying up @his room.",
              "It is a rainy afternoon, and @s has friends over."]
    key = (how, a, b, k, *sorted(gives))  # the two gifts can be given in either order
    return d.problem("sharing", key, scenes, facts, question, steps, rest // k)


def sharing_steps(d, how, gives):
    """sharing's worked solution: the total, what was given or added, each one's share."""
    steps = [d.step(["@S starts with {a} * {b} = {t} {things}.",
                     "There are {a} * {b} = {t} {things} in all.",
                     "{a} {boxes} of {b} make {a} * {b} = {t} {things}."])]
    if how == "get":
        steps.append(d.step(["With the new ones there are {t} + {c} = {rest} {things}.",
                             "Now @s has {t} + {c} = {rest} {things}."]))
    elif how == "give":
        steps.append(d.step(["Without those {c}, {t} - {c} = {rest} are left.",
                             "@S has {t} - {c} = {rest} {things} left.",
                             "That leaves {t} - {c} = {rest}."]))
    else:
        steps += [d.step(["@S gives away {c1} + {c2} = {g} {things}.",
                          "In all {c1} + {c2} = {g} go."],
                         c1=gives[0], c2=gives[1], g=sum(gives)),
                  d.step(["That leaves {t} - {g} = {rest} {things}.",
                          "{t} - {g} = {rest} are left."],
                         g=sum(gives))]
    steps.append(d.step(["Each {friend} gets {rest} / {k} = {each}.",
                         "So each one gets {rest} / {k} = {each}.",
                         "Shared among {k}, that is {rest} / {k} = {each} each."]))
    return steps


MODES = [  # how the main person travels: now, before, the doing of it, slowest and fastest per hour
    ("drives", "drove", "driving", 30, 70), ("cycles", "cycled", "cycling", 8, 25),
    ("walks", "walked", "walking", 3, 7), ("runs", "ran", "running", 5, 14),
    ("rides a scooter", "rode the scooter", "riding the scooter", 10, 30),
    ("rows a boat", "rowed", "rowing", 3, 10)]
UNITS = [("km", "km"), ("mile", "miles")]
TIMES = [("In the morning", "In the afternoon"), ("On Saturday", "On Sunday"),
         ("Before lunch", "After lunch")]


def travel(d):
    """Two legs at a speed for some hours: how far in all, or how far is left of a trip.
    3-4 steps."""
    rng = d.rng
    unit = rng.choice(UNITS)
    legs = []
    for mode in (rng.choice(MODES), rng.choice(MODES)):
        s, h = rng.randint(mode[3], mode[4]), rng.randint(2, 6)
        legs.append(dict(go=mode[0], went=mode[1], Doing=mode[2].capitalize(), s=s, h=h, d=s * h,
                         hours=count(h, HOUR)))
    total = legs[0]["d"] + legs[1]["d"]
    ask = d.pick(["total", "left"])
    trip = total + rng.randint(2, 60) if ask == "left" else 0
    d.v.update(units=unit[1], total=total, trip=trip, left=count(trip - total, unit),
               d1=legs[0]["d"], d2=legs[1]["d"])
    if d.pick(["first, then", "two times of day"]) == "first, then":
        facts = [d.say(["@S {go} at {s} {units} per hour for {hours}."], **legs[0]),
                 d.say(["Then @s {go} at {s} {units} an hour for {hours}.",
                        "After that, @s {go} for {hours} at {s} {units} per hour."], **legs[1])]
    else:
        times = d.pick(TIMES)
        tell = ["{time}, @s {go} at {s} {units} per hour for {hours}.",
                "{time}, @s {go} for {hours} at {s} {units} an hour."]
        facts = d.shuffled([d.say(tell, time=times[0], **legs[0]),
                            d.say(tell, time=times[1], **legs[1])])
    if ask == "left":
        trip_fact = d.say(["@S is on a trip of {trip} {units}.",
                           "The whole route is {trip} {units} long.",
                           "@S plans to cover {trip} {units} in all."])
        before = d.pick(["before", "after"]) == "before"
        facts = [trip_fact] + facts if before else facts + [trip_fact]
        question = d.say(["How many {units} does @s still have to go?",
                          "How much farther must @s travel?",
                          "How many {units} of the trip are left?",
                          "What distance does @s still have to cover?"])
    else:
        question = d.say(["How far does @s go in total?",
                          "How many {units} does @s travel altogether?",
                          "What distance does @s cover in all?"])
    leg = ["@S {went} {s} * {h} = {d} {units}.", "{Doing} covers {s} * {h} = {d} {units}.",
           "At {s} {units} per hour for {hours}: {s} * {h} = {d} {units}."]
    steps = [d.step(leg, **legs[0]), d.step(leg, **legs[1]),
             d.step(["In total @s travels {d1} + {d2} = {total} {units}.",
                     "Altogether that is {d1} + {d2} = {total} {units}.",
                     "The two parts add up to {d1} + {d2} = {total} {units}."])]
    if ask == "left":
        steps.append(d.step(["So {trip} - {total} = {left} are left.",
                             "@S still has {trip} - {total} = {left} to go.",
                             "That leaves {trip} - {total} = {left}."]))
    scenes = ["@S is going to visit @his grandmother.", "@S is on holiday by the coast.",
              "@S is out for a long day."]
    key = (ask, *sorted([(x["s"], x["h"]) for x in legs]), trip)  # the legs in either order
    return d.problem("travel", key, scenes, facts, question, steps, trip - total if trip else total)


GROUPS = [  # a group and its items, where they are, whole groups going, items going, items coming
    (("row", "rows"), ("chair", "chairs"), "the school hall",
     "{k} of the rows are folded up and put away", "{lost} are broken",
     "{e} more chairs are carried in"),
    (("box", "boxes"), ("pencil", "pencils"), "the school office",
     "{k} of the boxes are given to another class", "{lost} go missing",
     "@S finds {e} loose pencils in a drawer"),
    (("bus", "buses"), ("student", "students"), "the museum", "{k} of the buses leave early",
     "{lost} go home with their parents", "{e} more students arrive on foot"),
    (("shelf", "shelves"), ("book", "books"), "the library", "{k} of the shelves are packed away",
     "{lost} are borrowed", "{e} books are returned"),
    (("tray", "trays"), ("cupcake", "cupcakes"), "the bakery",
     "{k} of the trays are sold to a cafe", "{lost} are eaten",
     "a new batch of {e} cupcakes comes out of the oven"),
    (("crate", "crates"), ("apple", "apples"), "the farm shop",
     "{k} of the crates are sent to a school", "{lost} are bruised and thrown away",
     "{e} more apples are picked that afternoon")]


def groups(d):
    """Equal groups of items; whole groups or single items go, and more items come. 3 steps."""
    rng = d.rng
    group, item, place, whole, single, extra = rng.choice(GROUPS)
    g, m, e = rng.randint(4, 12), rng.randint(3, 15), rng.randint(2, 30)
    how = d.pick(["whole groups", "single items"])
    # at least 2 of everything that is counted, so every noun and verb is plural
    k = rng.randint(2, g - 2) if how == "whole groups" else rng.randint(2, min(30, g * m - 2))
    d.v.update(g=g, m=m, k=k, e=e, groups=group[1], items=item[1], place=place,
               Place=place.capitalize(), lost=count(k, item))
    facts = [d.say(["{Place} has {g} {groups} with {m} {items} in each.",
                    "There are {g} {groups} of {m} {items} in {place}.",
                    "@S counts {g} {groups} in {place}, each with {m} {items}."])]
    # what goes and what comes change the count the same way in either order
    events = [(whole if how == "whole groups" else single).format(**d.v), extra.format(**d.v)]
    facts += [s[0].upper() + s[1:] + "." for s in d.shuffled(events)]
    question = d.say(["How many {items} are there now?",
                      "How many {items} are in {place} at the end?",
                      "How many {items} does {place} have now?",
                      "What is the number of {items} at the end?"])
    if how == "whole groups":
        r, n = g - k, (g - k) * m
        steps = [d.step(["{g} - {k} = {r} {groups} are left.",
                         "That leaves {g} - {k} = {r} {groups}.",
                         "After that, {g} - {k} = {r} {groups} remain."], r=r),
                 d.step(["They hold {r} * {m} = {n} {items}.",
                         "{r} {groups} of {m} make {r} * {m} = {n}.",
                         "So there are {r} * {m} = {n} {items} in them."], r=r, n=n)]
    else:
        n = g * m - k
        steps = [d.step(["At first there are {g} * {m} = {n} {items}.",
                         "{g} {groups} of {m} make {g} * {m} = {n}.",
                         "{g} * {m} = {n} {items} to start with."], n=g * m),
                 d.step(["Then {n} - {k} = {r} are left.",
                         "Without those, there are {n} - {k} = {r} {items}."], n=g * m, r=n)]
    steps.append(d.step(["With the new ones: {n} + {e} = {x} {items}.",
                         "Adding {e} gives {n} + {e} = {x}.",
                         "In the end there are {n} + {e} = {x} {items}."], n=n, x=n + e))
    scenes = ["@S is helping to count things at {place}.", "It is a busy day at {place}."]
    return d.problem("groups", (how, g, m, k, e), scenes, facts, question, steps, n + e)


MULTIPLES = [("twice", 2), ("three times", 3), ("four times", 4)]


def relatives(child, adult):
    """Who could be `adult` years old when a relative is `child`: parents are at least 18 older."""
    gap = adult - child
    return (["mother", "father"] if gap >= 18 else []) + ["aunt", "uncle"] + (
        ["grandmother", "grandfather"] if gap >= 40 else [])


def ages(d):
    """Ages told through one another: an age some years from now, or some years ago. 3 steps."""
    rng = d.rng
    a, b, c = (name for name, _ in rng.sample(NAMES, 3))
    if d.pick(["times, later", "younger, older, ago"]) == "times, later":
        x, y, z = rng.randint(2, 15), rng.randint(2, 25), rng.randint(2, 30)
        mult, m = rng.choice(MULTIPLES[:2])
        r = m * (x + y)
        if not 30 <= r <= 90:
            return None
        d.v.update(a=a, b=b, x=x, y=y, m=m, z=z, by=x + y, r=r, mult=mult,
                   rel=rng.choice(relatives(x + y, r)))
        facts = [d.say(["{a} is {x} years old.", "{a} is {x}."]),
                 d.say(["{b} is {y} years older than {a}.", "{b} was born {y} years before {a}."]),
                 d.say(["{b}'s {rel} is {mult} as old as {b}.",
                        "{b} has {a_rel} who is {mult} as old as {b}."],
                       a_rel=("an " if d.v["rel"][0] in "au" else "a ") + d.v["rel"])]
        question = d.say(["How old will the {rel} be in {z} years?",
                          "In {z} years, how old will {b}'s {rel} be?",
                          "What will the {rel}'s age be {z} years from now?"])
        steps = [d.step(["{b} is {x} + {y} = {by} years old.", "{b}'s age is {x} + {y} = {by}."]),
                 d.step(["The {rel} is {m} * {by} = {r} years old.",
                         "So the {rel} is {m} * {by} = {r}."]),
                 d.step(["In {z} years the {rel} will be {r} + {z} = {ans}.",
                         "{z} years from now: {r} + {z} = {ans} years old."], ans=r + z)]
        key, answer = ("later", x, y, m, z), r + z
        scenes = ["{b}'s family is planning a birthday party.",
                  "The family is looking at old photos."]
    else:
        x, y, w = rng.randint(12, 50), rng.randint(2, 15), rng.randint(2, 20)
        cy = x - y + w
        if x - y < 5:
            return None
        z = rng.randint(2, min(20, cy - 2))
        d.v.update(a=a, b=b, c=c, x=x, y=y, w=w, z=z, by=x - y, cy=cy)
        facts = [d.say(["{a} is {x} years old.", "{a} is {x}."]),
                 d.say(["{b} is {y} years younger than {a}.", "{b} was born {y} years after {a}."]),
                 d.say(["{c} is {w} years older than {b}.", "{c} was born {w} years before {b}."])]
        question = d.say(["How old was {c} {z} years ago?", "What was {c}'s age {z} years ago?"])
        steps = [d.step(["{b} is {x} - {y} = {by} years old.", "{b}'s age is {x} - {y} = {by}."]),
                 d.step(["{c} is {by} + {w} = {cy} years old.",
                         "So {c} is {by} + {w} = {cy} now."]),
                 d.step(["{z} years ago {c} was {cy} - {z} = {ans}.",
                         "Back then: {cy} - {z} = {ans} years old."], ans=cy - z)]
        key, answer = ("ago", x, y, w, z), cy - z
        scenes = ["{a}, {b} and {c} are talking about birthdays.", "Three neighbors compare ages."]
    if d.pick(["forwards", "backwards"]) == "backwards":
        facts = facts[::-1]  # each fact names the two people it links: the chain reads either way
    return d.problem("ages", key, scenes, facts, question, steps, answer)


def comparison(d):
    """'Twice as many', 'half as many', then some more or fewer: the third person's count, or all
    three together. 2-4 steps."""
    rng = d.rng
    a, b, c = (name for name, _ in rng.sample(NAMES, 3))
    thing = rng.choice(THINGS)
    mult, m = rng.choice(MULTIPLES + [("half", 2)])
    x = rng.randint(2, 50) if mult != "half" else 2 * rng.randint(2, 30)
    by = x // 2 if mult == "half" else x * m
    than = d.pick(["first", "second"])  # whom the third person is compared with: changes the sum
    base, less, diff = (x if than == "first" else by), rng.random() < 0.5, rng.randint(2, 30)
    if less and diff >= base:
        return None
    cy = base - diff if less else base + diff
    d.v.update(a=a, b=b, c=c, x=x, m=m, by=by, base=base, diff=diff, cy=cy, s=x + by,
               things=thing[1], mult=mult, more="fewer" if less else "more",
               op="-" if less else "+",
               ref=a if than == "first" else b, xs=count(x, thing), bys=count(by, thing),
               cys=count(cy, thing), ts=count(x + by + cy, thing))
    facts = [d.say(["{a} has {xs}.", "{a} has collected {xs}."]),
             d.say(["{b} has {mult} as many {things} as {a}.",
                    "{b} owns {mult} as many {things} as {a} does."]),
             d.say(["{c} has {diff} {more} {things} than {ref}.",
                    "{c} has {diff} {more} than {ref}."])]
    if d.pick(["forwards", "backwards"]) == "backwards":
        facts = facts[::-1]  # each fact names the people it links, so the facts read either way
    ask = d.pick(["all", "third"])
    if ask == "all":
        question = d.say(["How many {things} do the three of them have altogether?",
                          "How many {things} do {a}, {b} and {c} have in total?",
                          "What is the total number of {things} they have?"])
    else:
        question = d.say(["How many {things} does {c} have?", "How many {things} does {c} own?",
                          "What number of {things} does {c} have?"])
    if mult == "half":
        steps = [d.step(["{b} has {x} / 2 = {bys}.", "Half of {x} is {x} / 2 = {by}."])]
    else:
        steps = [d.step(["{b} has {x} * {m} = {bys}.",
                         "{Mult} as many as {a} is {x} * {m} = {by}."],
                        Mult=mult.capitalize())]
    steps.append(d.step(["{c} has {base} {op} {diff} = {cys}.",
                         "That means {c} has {base} {op} {diff} = {cy}."]))
    if ask == "all":
        steps += [d.step(["{a} and {b} have {x} + {by} = {s} together.",
                          "The first two have {x} + {by} = {s}."]),
                  d.step(["With {c}, the total is {s} + {cy} = {ts}.",
                          "Altogether they have {s} + {cy} = {ts}."])]
    scenes = ["{a}, {b} and {c} compare their collections.", "Three friends collect {things}."]
    key = (ask, mult, x, than, "less" if less else "more", diff)
    answer = x + by + cy if ask == "all" else cy
    return d.problem("comparison", key, scenes, facts, question, steps, answer)


STOCK = [("bakery", ("loaf of bread", "loaves of bread")),
         ("toy shop", ("teddy bear", "teddy bears")),
         ("bookshop", ("book", "books")), ("flower shop", ("rose", "roses")),
         ("farm stand", ("melon", "melons")), ("shoe shop", ("pair of boots", "pairs of boots")),
         ("hardware store", ("hammer", "hammers"))]


def inventory(d):
    """A shop's stock through sales and a delivery of boxes. 3-4 steps."""
    rng = d.rng
    shop, item = rng.choice(STOCK)
    s, a, b = rng.randint(30, 150), rng.randint(2, 30), rng.randint(2, 30)
    c, n = rng.randint(2, 8), rng.randint(4, 20)
    day1, day2 = sorted(rng.sample(range(7), 2))
    two_sales = d.pick(["two sales, then a delivery", "a delivery, then a sale"]).startswith("two")
    if two_sales and a + b > s - 2:
        return None
    new = c * n
    d.v.update(shop=shop, items=item[1], s=s, a=a, b=b, c=c, n=n, new=new, day1=DAYS[day1],
               day2=DAYS[day2], stock=count(s, item), boxes=count(c, ("box", "boxes")), sold=a + b)
    facts = [d.say(["The {shop} has {stock}.", "@His {shop} starts the week with {stock}.",
                    "There are {stock} in the {shop}."])]
    delivery = d.say(["A delivery brings {boxes} with {n} {items} in each.",
                      "Then {boxes} of {n} {items} arrive.",
                      "@S orders {boxes} of {n} {items}, which arrive the same week."])
    add = ["The delivery adds {c} * {n} = {new} {items}.",
           "{c} boxes of {n} hold {c} * {n} = {new}."]
    if two_sales:
        facts += [d.say(["It sells {a} on {day1} and {b} on {day2}.",
                         "On {day1} {a} are sold, and on {day2} {b} more."]), delivery]
        x = s - a - b + new
        steps = [d.step(["The {shop} sells {a} + {b} = {sold} {items}.",
                         "In two days {a} + {b} = {sold} are sold."]),
                 d.step(["That leaves {s} - {sold} = {left}.",
                         "Then {s} - {sold} = {left} {items} remain."], left=s - a - b),
                 d.step(add),
                 d.step(["Now there are {left} + {new} = {x} {items}.",
                         "So the {shop} has {left} + {new} = {x}."], left=s - a - b, x=x)]
    else:
        facts += [delivery, d.say(["Then it sells {a} on {day1}.",
                                   "On {day1} {a} of them are sold."])]
        x = s + new - a
        steps = [d.step(add),
                 d.step(["With the delivery there are {s} + {new} = {t}.",
                         "That makes {s} + {new} = {t} {items}."], t=s + new),
                 d.step(["After the sale, {t} - {a} = {x} are left.",
                         "So {t} - {a} = {x} {items} remain."], t=s + new, x=x)]
    question = d.say(["How many {items} does the {shop} have now?",
                      "How many {items} are left in the {shop}?",
                      "How many {items} are there at the end of the week?",
                      "What is the {shop}'s stock of {items} now?"])
    scenes = ["It is a busy week at the {shop}.", "The {shop} keeps a careful count of its stock."]
    key = ("two sales" if two_sales else "one sale", s, a, b if two_sales else 0, c, n)
    return d.problem("inventory", key, scenes, facts, question, steps, x)


PLOTS = ["garden", "yard", "playground", "vegetable patch", "goat pen", "tennis court"]
LENGTHS = [(("meter", "meters"), ("square meter", "square meters")),
           (("foot", "feet"), ("square foot", "square feet"))]


def geometry(d):
    """A fence around a rectangle with a gate, or the floor a rug leaves bare (and what tiling it
    costs). 3-4 steps."""
    rng = d.rng
    unit, square = rng.choice(LENGTHS)
    how = d.pick(["fence", "bare floor", "tile cost"])
    d.v.update(units=unit[1], unit=unit[0], sq=square[1], sq1=square[0])
    if how == "fence":
        return fence_cost(d, rng, unit)
    x, y, a, b = rng.randint(5, 25), rng.randint(4, 20), rng.randint(2, 8), rng.randint(2, 8)
    p = rng.randint(2, 5) if how == "tile cost" else 0
    bare = x * y - a * b
    if a >= x or b >= y or bare * max(p, 1) > 1000:
        return None
    d.v.update(l=x, w=y, a=a, b=b, p=p, A=x * y, r=a * b, bare=bare, cost=bare * p)
    facts = [d.say(["A room is {l} {units} long and {w} {units} wide.",
                    "@His living room floor measures {l} {units} by {w} {units}."]),
             d.say(["A rug that is {a} {units} by {b} {units} lies on the floor.",
                    "@S puts down a rug {a} {units} long and {b} {units} wide."])]
    if how == "tile cost":
        facts.append(d.say(["@S will tile the rest of the floor, and tiles cost ${p} per {sq1}.",
                            "The floor the rug leaves bare will be tiled at ${p} per {sq1}."]))
        question = d.say(["How much will the tiles cost?", "What will the tiles cost?",
                          "How many dollars will the tiling cost?"])
    else:
        question = d.say(["How many {sq} of floor does the rug leave bare?",
                          "How many {sq} of the floor are not covered?",
                          "What area of the floor, in {sq}, is left bare?"])
    steps = [d.step(["The floor is {l} * {w} = {A} {sq}.",
                     "The whole floor has {l} * {w} = {A} {sq}."]),
             d.step(["The rug covers {a} * {b} = {r} {sq}.", "The rug takes up {a} * {b} = {r}."]),
             d.step(["That leaves {A} - {r} = {bare} {sq} bare.",
                     "Not covered: {A} - {r} = {bare} {sq}."])]
    if how == "tile cost":
        steps.append(d.step(["The tiles cost {bare} * {p} = {cost} dollars.",
                             "So {bare} * {p} = {cost} dollars."]))
    scenes = ["@S is redoing the floor at home.", "@S has just moved into a new flat."]
    answer = bare * p if how == "tile cost" else bare
    return d.problem("geometry", (how, x, y, a, b, p), scenes, facts, question, steps, answer)


def fence_cost(d, rng, unit):
    """geometry: a fence around a rectangle with a gate, and what it costs."""
    x, y, g, p = rng.randint(5, 40), rng.randint(3, 30), rng.randint(1, 4), rng.randint(2, 9)
    fence = 2 * (x + y) - g
    if y >= x or fence * p > 1000:
        return None
    d.v.update(l=x, w=y, g=g, p=p, s=x + y, P=fence + g, fence=fence, cost=fence * p,
               plot=rng.choice(PLOTS), gate=count(g, unit))
    facts = d.shuffled([
        d.say(["@S wants to fence a rectangular {plot} that is {l} {units} long and {w} "
               "{units} wide.", "A rectangular {plot} measures {l} {units} by {w} {units}."]),
        d.say(["A gate {gate} wide needs no fence.",
               "The fence leaves a gap of {gate} for a gate."]),
        d.say(["Fencing costs ${p} per {unit}.", "Each {unit} of fence costs ${p}."])])
    question = d.say(["How much will the fence cost?",
                      "What does the fence around the {plot} cost?",
                      "How many dollars will the fencing cost?"])
    steps = [d.step(["One length and one width make {l} + {w} = {s} {units}.",
                     "{l} + {w} = {s} {units}."]),
             d.step(["The perimeter is 2 * {s} = {P} {units}.",
                     "All the way around is 2 * {s} = {P} {units}."]),
             d.step(["Without the gate, {P} - {g} = {fence} {units} need fencing.",
                     "Taking off the gate leaves {P} - {g} = {fence}."]),
             d.step(["The fence costs {fence} * {p} = {cost} dollars.",
                     "At {p} dollars each: {fence} * {p} = {cost}."])]
    scenes = ["@S is fixing up @his backyard.", "A new fence is going up this summer."]
    return d.problem("geometry", ("fence", x, y, g, p), scenes, facts, question, steps, fence * p)


JOBS = ["walking dogs", "babysitting", "washing cars", "mowing lawns", "tutoring",
        "helping at a bakery"]
WANTS = ["a bike", "a guitar", "a tablet", "a pair of skates", "a telescope", "a video game",
         "an art set"]


def savings(d):
    """Money saved by the week or earned by the hour: what is left, or how many weeks until a thing
    is affordable. 3 steps."""
    rng = d.rng
    how = d.pick(["left", "weeks", "wage"])
    d.v.update(job=rng.choice(JOBS), want=rng.choice(WANTS))
    scenes = ["@S is saving up for something special.", "@S keeps careful track of @his money."]
    if how == "left":
        return savings_left(d, rng, scenes)
    if how == "weeks":
        return savings_weeks(d, rng, scenes)
    w, h1, h2 = rng.randint(5, 20), rng.randint(2, 8), rng.randint(2, 8)
    day1, day2 = sorted(rng.sample(range(7), 2))
    tips = d.pick(["tips", "spend"]) == "tips"
    earned = w * (h1 + h2)
    c = rng.randint(2, min(40, earned - 1))
    x = earned + c if tips else earned - c
    d.v.update(w=w, h1=h1, h2=h2, c=c, H=h1 + h2, earned=earned, x=x, day1=DAYS[day1],
               day2=DAYS[day2], hours2=count(h2, HOUR))
    facts = [d.say(["@S earns ${w} an hour {job}.", "@S is paid ${w} per hour for {job}."]),
             d.say(["@S works {h1} hours on {day1} and {hours2} on {day2}.",
                    "On {day1} @s works {h1} hours, and on {day2} {hours2}."]),
             d.say(["@S also gets ${c} in tips.",
                    "On top of that, @s is given ${c} in tips."] if tips
                   else ["Afterwards @s spends ${c} on {want}.",
                         "Then @s spends ${c} of it on {want}."])]
    question = d.say(["How much does @s earn in all?", "How many dollars does @s get altogether?",
                      "What does @s earn in all?"]
                     if tips else ["How much money does @s have left?",
                                   "How many dollars does @s keep?", "What amount does @s keep?"])
    steps = [d.step(["@S works {h1} + {h2} = {H} hours.",
                     "In all that is {h1} + {h2} = {H} hours."]),
             d.step(["@S earns {H} * {w} = {earned} dollars.",
                     "At {w} dollars an hour: {H} * {w} = {earned}."]),
             d.step(["With the tips: {earned} + {c} = {x} dollars.",
                     "Adding the tips, {earned} + {c} = {x}."] if tips else
                    ["After spending: {earned} - {c} = {x} dollars.",
                     "That leaves {earned} - {c} = {x}."])]
    key = ("tips" if tips else "spend", w, *sorted([h1, h2]), c)  # the two days in either order
    return d.problem("savings", key, scenes, facts, question, steps, x)


def savings_left(d, rng, scenes):
    """savings: what is left after saving by the week and spending."""
    h, s, w = rng.randint(2, 50), rng.randint(2, 20), rng.randint(2, 12)
    total = h + s * w
    c = rng.randint(2, min(100, total - 1))
    d.v.update(h=h, s=s, w=w, c=c, saved=s * w, total=total, left=count(total - c, DOLLAR))
    facts = [d.say(["@S has ${h} in a piggy bank.", "@S starts with ${h}."]),
             d.say(["@S saves ${s} every week for {w} weeks.",
                    "For {w} weeks, @s puts away ${s} a week."]),
             d.say(["Then @s spends ${c} on {want}.", "After that @s buys {want} for ${c}."])]
    question = d.say(["How much money does @s have left?", "How many dollars are left?",
                      "What amount does @s have left?"])
    steps = [d.step(["@S saves {s} * {w} = {saved} dollars.",
                     "In {w} weeks that is {s} * {w} = {saved} dollars."]),
             d.step(["With the piggy bank, @s has {h} + {saved} = {total}.",
                     "{h} + {saved} = {total} dollars in all."]),
             d.step(["After buying {want}, {total} - {c} = {left} are left.",
                     "That leaves {total} - {c} = {left}."])]
    return d.problem("savings", ("left", h, s, w, c), scenes, facts, question, steps, total - c)


def savings_weeks(d, rng, scenes):
    """savings: how many weeks until a thing is affordable."""
    f, s, n, h = rng.randint(1, 10), rng.randint(2, 15), rng.randint(2, 12), rng.randint(5, 60)
    price = h + s * n
    d.v.update(e=s + f, f=f, s=s, h=h, price=price, need=s * n, weeks=count(n, WEEK))
    facts = d.shuffled([d.say(["@S earns ${e} a week {job} and spends ${f} of it.",
                               "Each week @s makes ${e} {job}, but spends ${f}."]),
                        d.say(["@S wants {want} that costs ${price}.",
                               "@S would like {want} priced at ${price}."]),
                        d.say(["@S already has ${h}.", "@S has saved ${h} so far."])])
    question = d.say(["How many weeks will it take @him to save enough?",
                      "How many weeks must @s save?", "For how many weeks must @s save?"])
    steps = [d.step(["@S saves {e} - {f} = {s} dollars a week.",
                     "Each week @s keeps {e} - {f} = {s} dollars."]),
             d.step(["@S still needs {price} - {h} = {need} dollars.",
                     "There is {price} - {h} = {need} to go."]),
             d.step(["That takes {need} / {s} = {weeks}.",
                     "So @s needs {need} / {s} = {weeks}."])]
    return d.problem("savings", ("weeks", s + f, f, h, price), scenes, facts, question, steps, n)


TASKS = [  # a long task done a part a day: the task, its unit, doing some of it now and before
    ("a book with {N} pages", ("page", "pages"), "reads", "read"),
    ("a jigsaw puzzle with {N} pieces", ("piece", "pieces"), "fits", "fit"),
    ("a list of {N} spelling words to learn", ("word", "words"), "learns", "learned"),
    ("a workbook with {N} practice problems", ("problem", "problems"), "solves", "solved"),
    ("an album of {N} old photos to scan", ("photo", "photos"), "scans", "scanned")]


def reading(d):
    """A long task done a part a day: how many more days, or how much is left. 3 steps."""
    rng = d.rng
    task, unit, does, did = rng.choice(TASKS)
    p, days = rng.randint(5, 30), rng.randint(2, 7)
    how = d.pick(["days", "left"])
    q, more, extra = (rng.randint(5, 40), rng.randint(2, 8), 0) if how == "days" else (
        0, 0, rng.randint(2, 30))
    done = p * days
    N = done + q * more if how == "days" else done + extra + rng.randint(10, 200)
    d.v.update(p=p, q=q, days=days, N=N, done=done, extra=extra, units=unit[1], does=does, did=did,
               task=task.format(N=N), left=N - done, day=rng.choice(DAYS))
    facts = [d.say(["@S starts on {task}.", "@S has {task}."]),
             d.say(["@S {does} {p} {units} a day for {days} days.",
                    "For {days} days, @s {does} {p} {units} a day."])]
    first = d.step(["In {days} days @s {did} {p} * {days} = {done} {units}.",
                    "The first {days} days cover {p} * {days} = {done} {units}."])
    if how == "days":
        facts.append(d.say(["After that, @s {does} {q} {units} a day.",
                            "Then @s speeds up to {q} {units} a day."]))
        question = d.say(["How many more days does @s need to finish?",
                          "How many more days will it take to finish?",
                          "In how many more days will @s finish?"])
        steps = [first,
                 d.step(["That leaves {N} - {done} = {left} {units}.",
                         "There are {N} - {done} = {left} to go."]),
                 d.step(["At {q} a day, that takes {left} / {q} = {ans} more days.",
                         "So @s needs {left} / {q} = {ans} more days."], ans=more)]
        key, answer = (how, p, days, q, N), more
    else:
        facts.append(d.say(["On {day} @s {does} {extra} more.",
                            "Then, in one long evening, @s {does} {extra} more."]))
        question = d.say(["How many {units} are left?", "How many {units} has @s not done yet?",
                          "What number of {units} is still to do?"])
        answer = N - done - extra
        steps = [first,
                 d.step(["With the extra ones that is {done} + {extra} = {all}.",
                         "{done} + {extra} = {all} done."], all=done + extra),
                 d.step(["So {N} - {all} = {ans} {units} are left.",
                         "That leaves {N} - {all} = {ans}."],
                        all=done + extra, ans=answer)]
        key = (how, p, days, extra, N)
    scenes = ["@S has set a goal for the month.", "@S likes to do a little every day."]
    return d.problem("reading", key, scenes, facts, question, steps, answer)


FAMILIES = [shopping, sharing, travel, groups, ages, comparison, inventory, geometry, savings,
            reading]

# -----------------------------------------------------------------------------
# the split and the sampler


def split_of(key):
    """The split a problem's identity hashes to: ~7% test, ~3% val, the rest train."""
    h = int(hashlib.sha256("|".join(map(str, key)).encode()).hexdigest(), 16) % 1000
    if h < TEST_PER_MILLE:
        return "test"
    return "val" if h < TEST_PER_MILLE + VAL_PER_MILLE else "train"


def sample_splits(sizes, seed):
    """{split: [Problem]}: one stream of problems from one sampler (a family uniformly at random,
    then its numbers and wording), each sent to the split its hash names and kept if it is new and
    that split still needs problems of its family. Of a split's n problems each of the F families
    gets n // F (the first families one more)."""
    rng = random.Random(seed)
    F = len(FAMILIES)
    want = {split: {f.__name__: n // F + (i < n % F) for i, f in enumerate(FAMILIES)}
            for split, n in sizes.items()}
    out, seen, draws = {split: [] for split in sizes}, set(), 0
    while any(n for per_family in want.values() for n in per_family.values()):
        draws += 1
        if draws > 100 * (sum(sizes.values()) + 100):
            raise ValueError(f"asked for {sizes}: more distinct problems than the families hold")
        problem = rng.choice(FAMILIES)(Draw(rng))
        if problem is None or problem.key in seen:
            continue
        seen.add(problem.key)
        split = split_of(problem.key)
        if want[split][problem.family] > 0:
            want[split][problem.family] -= 1
            out[split].append(problem)
    return out


def mean_length(texts):
    return sum(map(len, texts)) / max(1, len(texts))


def main(out_dir=HERE, n_train=20_000, n_val=300, n_test=1000, seed=1337):
    sizes = {"train": n_train, "val": n_val, "test": n_test}
    splits = sample_splits(sizes, seed)
    for split, problems in splits.items():
        with open(os.path.join(out_dir, f"{split}.jsonl"), "w", encoding="utf-8") as f:
            for p in problems:
                row = dict(prompt=p.prompt, response=p.response, answer=p.answer)
                f.write(json.dumps(row) + "\n")
    meta = dict(sizes=sizes, seed=seed, families=[f.__name__ for f in FAMILIES],
                answer_marker="####",
                split=f"sha256 of the problem's identity mod 1000: < {TEST_PER_MILLE} test, "
                      f"< {TEST_PER_MILLE + VAL_PER_MILLE} val, else train")
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(f"wrote {sizes} problems (seed {seed}) and meta.json to {out_dir}")
    print(f"{'family':<12}" + "".join(f"{split:>7}" for split in sizes))
    for family in meta["families"]:
        print(f"{family:<12}" + "".join(
            f"{sum(p.family == family for p in splits[split]):>7}" for split in sizes))
    every = [p for problems in splits.values() for p in problems]
    print(f"mean characters: prompt {mean_length([p.prompt for p in every]):.0f}, response "
          f"{mean_length([p.response for p in every]):.0f}; "
          f"{len({p.template for p in every})} prompt templates")
    return splits


if __name__ == "__main__":
    out_dir, *sizes = sys.argv[1:5] or [HERE]
    main(out_dir, *map(int, sizes))
