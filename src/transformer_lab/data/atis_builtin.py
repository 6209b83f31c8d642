"""A generated ATIS-style corpus: the offline default data set.

A seeded grammar of flight queries in the ATIS annotation scheme (BIO slot tags with
ATIS slot names, ATIS intent names including one multi-intent, `atis_flight#atis_airfare`).
Templates hold `{slot.name}` (a value from VALUES, tagged B-/I-), `{MACRO}` (a phrase
from MACROS, expanded recursively) and `{?...}` (optional, present half of the time).
"""

from __future__ import annotations

import random

CITIES = [
    "boston", "denver", "atlanta", "dallas", "pittsburgh", "baltimore", "philadelphia", "san francisco",
    "oakland", "washington", "new york", "chicago", "miami", "seattle", "houston", "detroit", "phoenix",
    "salt lake city", "st. louis", "kansas city", "las vegas", "los angeles", "san diego", "minneapolis",
    "milwaukee", "memphis", "nashville", "cleveland", "cincinnati", "columbus", "indianapolis", "orlando",
    "tampa", "charlotte", "newark", "toronto", "montreal", "st. petersburg", "fort worth", "san jose",
    "long beach", "ontario", "burbank", "tacoma", "westchester county",
]
AIRPORTS = [
    "logan", "la guardia", "general mitchell", "love field", "o'hare", "stapleton", "dulles",
    "john f. kennedy", "midway", "hartsfield", "pearson", "dallas fort worth",
]
STATES = ["california", "texas", "georgia", "colorado", "massachusetts", "pennsylvania", "florida", "ohio"]

VALUES: dict[str, list[str]] = {
    "city_name": CITIES,
    "fromloc.city_name": CITIES,
    "toloc.city_name": CITIES,
    "stoploc.city_name": CITIES,
    "airport_name": AIRPORTS,
    "fromloc.airport_name": AIRPORTS,
    "toloc.airport_name": AIRPORTS,
    "airport_code": ["bwi", "lax", "jfk", "dfw", "sfo", "ord", "mco", "ewr", "atl", "mke", "bos", "den"],
    "toloc.airport_code": ["bwi", "lax", "jfk", "dfw", "sfo", "ord", "mco", "ewr", "atl", "mke"],
    "state_name": STATES,
    "toloc.state_name": STATES,
    "airline_name": [
        "united", "american airlines", "delta", "continental", "us air", "northwest", "twa",
        "alaska airlines", "america west", "lufthansa", "canadian airlines", "eastern", "midwest express",
    ],
    "airline_code": ["ua", "aa", "dl", "co", "us", "nw", "tw", "as", "hp", "lh", "cp", "yx"],
    "depart_date.day_name": ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"],
    "arrive_date.day_name": ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"],
    "return_date.day_name": ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"],
    "depart_date.month_name": [
        "january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
        "november", "december",
    ],
    "depart_date.day_number": [
        "first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth",
        "twelfth", "fifteenth", "twentieth", "twenty first", "twenty second", "twenty fifth", "thirtieth",
    ],
    "depart_date.date_relative": ["today", "tomorrow", "day after tomorrow"],
    "depart_time.time": ["8 am", "9 am", "10 am", "noon", "1 pm", "3 pm", "5 pm", "6 pm", "7 pm", "1130", "8 o'clock"],
    "arrive_time.time": ["8 am", "11 am", "noon", "2 pm", "4 pm", "6 pm", "9 pm", "1030", "5 o'clock"],
    "depart_time.period_of_day": ["morning", "afternoon", "evening", "night", "early morning"],
    "arrive_time.period_of_day": ["morning", "afternoon", "evening", "night"],
    "depart_time.time_relative": ["before", "after", "around", "about"],
    "arrive_time.time_relative": ["before", "after", "by", "around"],
    "cost_relative": ["cheapest", "lowest", "least expensive", "most expensive", "highest"],
    "fare_amount": ["200 dollars", "300 dollars", "500 dollars", "1000 dollars", "150 dollars"],
    "class_type": ["first class", "business class", "coach", "thrift"],
    "economy": ["economy"],
    "round_trip": ["round trip", "one way"],
    "flight_mod": ["last", "first", "earliest", "latest", "next"],
    "flight_stop": ["nonstop", "direct", "one stop"],
    "connect": ["connecting"],
    "meal": ["breakfast", "lunch", "dinner", "snack", "meal"],
    "aircraft_code": ["737", "767", "747", "d9s", "m80", "dc10", "l1011", "72s", "733"],
    "flight_number": ["100", "297", "1291", "417", "838", "21", "459", "1765"],
    "transport_type": ["limousine", "taxi", "car", "rental car", "air taxi operation", "bus"],
    "fare_basis_code": ["qx", "y", "f", "h", "bh", "qw", "m", "yn"],
    "restriction_code": ["ap/57", "ap 80", "ap/68", "s/2"],
}

MACROS: dict[str, list[str]] = {
    "FROM": [
        "from {fromloc.city_name}", "from {fromloc.city_name}", "leaving {fromloc.city_name}",
        "out of {fromloc.city_name}", "departing from {fromloc.city_name}", "from {fromloc.airport_name}",
    ],
    "TO": [
        "to {toloc.city_name}", "to {toloc.city_name}", "into {toloc.city_name}", "arriving in {toloc.city_name}",
        "going to {toloc.city_name}", "to {toloc.airport_code}", "to {toloc.airport_name}",
    ],
    "ROUTE": [
        "{FROM} {TO}", "{FROM} {TO}", "{FROM} {TO}", "{TO} {FROM}", "between {fromloc.city_name} and {toloc.city_name}",
        "{FROM} {TO} with a stop in {stoploc.city_name}", "{FROM} {TO} via {stoploc.city_name}",
    ],
    "DATE": [
        "on {depart_date.day_name}", "{depart_date.date_relative}", "on {depart_date.month_name} {depart_date.day_number}",
        "next {depart_date.day_name}", "{depart_date.day_name} {depart_time.period_of_day}",
        "on {depart_date.day_name} returning on {return_date.day_name}", "arriving on {arrive_date.day_name}",
    ],
    "TIME": [
        "in the {depart_time.period_of_day}", "{depart_time.time_relative} {depart_time.time}", "at {depart_time.time}",
        "arriving {arrive_time.time_relative} {arrive_time.time}", "that arrive in the {arrive_time.period_of_day}",
    ],
    "AIRLINE": ["on {airline_name}", "on {airline_name}", "with {airline_name}", "on {airline_code}"],
    "FARE_FILTER": ["under {fare_amount}", "for less than {fare_amount}", "in {class_type}", "in {economy}"],
}

TEMPLATES: dict[str, list[str]] = {
    "flight": [
        "show me {?flight_mod} {?flight_stop} flights {ROUTE} {?DATE} {?TIME}",
        "i would like to fly {ROUTE} {?DATE} {?TIME}",
        "what flights are available {ROUTE} {?DATE} {?TIME}",
        "i need a {?round_trip} flight {ROUTE} {?DATE} {?AIRLINE}",
        "list {?airline_name} flights {ROUTE} {?TIME}",
        "give me the {flight_mod} flight {ROUTE} {?DATE}",
        "are there any {flight_stop} flights {ROUTE} {?DATE}",
        "flights {ROUTE} {?DATE} {?TIME}",
        "please find a flight {ROUTE} that serves {meal}",
        "i want to go {ROUTE} {DATE} {?AIRLINE}",
        "find me a {connect} flight {ROUTE} {?TIME}",
        "which flights leave {fromloc.city_name} {?TIME} and arrive in {toloc.city_name}",
        "do you have a {?class_type} flight {ROUTE} {?DATE}",
        "show me flights {ROUTE} on a {aircraft_code}",
    ],
    "airfare": [
        "what is the {?cost_relative} fare {ROUTE}",
        "how much is a {?class_type} ticket {ROUTE}",
        "show me the {cost_relative} {?round_trip} fares {ROUTE} {?DATE}",
        "what are the fares for flights {ROUTE} {FARE_FILTER}",
        "i want a {round_trip} ticket {ROUTE} {FARE_FILTER}",
        "how much does it cost to fly {ROUTE} {?AIRLINE}",
    ],
    "ground_service": [
        "what ground transportation is available in {city_name}",
        "is there {transport_type} service at {airport_name}",
        "i need a {transport_type} from the {airport_name} airport to downtown {city_name}",
        "show me ground transportation in {city_name} {?DATE}",
        "what kind of {transport_type} can i get at {airport_code}",
    ],
    "airline": [
        "which airlines fly {ROUTE}",
        "what airline is {airline_code}",
        "show me the airlines that have {class_type} service {ROUTE}",
        "which airline has the {cost_relative} fare {ROUTE}",
    ],
    "abbreviation": [
        "what does {fare_basis_code} mean",
        "what is {airline_code}",
        "what does the code {restriction_code} stand for",
        "explain fare code {fare_basis_code}",
        "what does {aircraft_code} mean",
    ],
    "aircraft": [
        "what type of aircraft is used {ROUTE}",
        "what kind of plane is a {aircraft_code}",
        "which aircraft does {airline_name} use {ROUTE}",
    ],
    "flight_time": [
        "what time does the {flight_mod} flight {ROUTE} leave",
        "what are the departure times {ROUTE} {?DATE}",
        "when does flight {flight_number} arrive in {toloc.city_name}",
        "what is the schedule of flights {ROUTE} {?DATE}",
    ],
    "quantity": [
        "how many flights does {airline_name} have {ROUTE}",
        "how many airlines fly {ROUTE}",
        "how many {class_type} flights leave {fromloc.city_name} {?DATE}",
    ],
    "airport": [
        "what airports are in {city_name}",
        "which airports are in {state_name}",
        "list the airports near {city_name}",
    ],
    "distance": [
        "how far is {airport_name} from downtown {city_name}",
        "what is the distance from {fromloc.city_name} to {toloc.city_name}",
    ],
    "capacity": [
        "how many people can a {aircraft_code} hold",
        "what is the seating capacity of the {aircraft_code}",
        "how many seats are there on {airline_name} {aircraft_code}",
    ],
    "meal": [
        "what meals are served on {airline_name} flight {flight_number}",
        "is {meal} served on flights {ROUTE}",
    ],
    "flight_no": [
        "what is the flight number of the {flight_mod} flight {ROUTE}",
        "give me the flight numbers {ROUTE} {DATE}",
    ],
    "ground_fare": ["how much does a {transport_type} cost in {city_name}", "what is the cost of a {transport_type} at {airport_name}"],
    "restriction": ["what are the restrictions on the {cost_relative} fare {ROUTE}", "what is restriction {restriction_code}"],
    "city": ["what cities does {airline_name} serve", "where is {airport_code}", "which city is {airport_name} in"],
    "flight#airfare": ["show me flights and fares {ROUTE} {?DATE}", "list flights {ROUTE} and their prices"],
}

# ATIS is dominated by `flight`; keep that skew so the sample behaves like the real corpus.
INTENT_WEIGHTS: dict[str, float] = {
    "flight": 0.55, "airfare": 0.09, "ground_service": 0.06, "airline": 0.04, "abbreviation": 0.03,
    "aircraft": 0.03, "flight_time": 0.03, "quantity": 0.02, "airport": 0.02, "distance": 0.02,
    "capacity": 0.02, "meal": 0.02, "flight_no": 0.02, "ground_fare": 0.02, "restriction": 0.01,
    "city": 0.01, "flight#airfare": 0.01,
}


def _expand(template: str, rng: random.Random, words: list[str], tags: list[str]) -> None:
    for piece in template.split():
        if not (piece.startswith("{") and piece.endswith("}")):
            words.append(piece)
            tags.append("O")
            continue
        name = piece[1:-1]
        if name.startswith("?"):
            name = name[1:]
            if rng.random() < 0.5:
                continue
        if name in MACROS:
            _expand(rng.choice(MACROS[name]), rng, words, tags)
        else:
            value = rng.choice(VALUES[name]).split()
            words.extend(value)
            tags.extend([f"B-{name}"] + [f"I-{name}"] * (len(value) - 1))


def generate_utterance(rng: random.Random) -> dict:
    intent = rng.choices(list(INTENT_WEIGHTS), weights=list(INTENT_WEIGHTS.values()))[0]
    words: list[str] = []
    tags: list[str] = []
    _expand(rng.choice(TEMPLATES[intent]), rng, words, tags)
    # Named as in the ATIS corpus: atis_flight, atis_flight#atis_airfare, ...
    return {"words": words, "slots": tags, "intent": "#".join(f"atis_{part}" for part in intent.split("#"))}


def generate_atis_sample(seed: int = 0, n_train: int = 4000, n_dev: int = 500, n_test: int = 800) -> dict[str, list[dict]]:
    """Returns {"train": [...], "dev": [...], "test": [...]}, each a list of {words, slots, intent}."""
    rng = random.Random(seed)
    sizes = {"train": n_train, "dev": n_dev, "test": n_test}
    return {split: [generate_utterance(rng) for _ in range(size)] for split, size in sizes.items()}
