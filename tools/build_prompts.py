#!/usr/bin/env python3
"""Build the prompt sets used by MARS Playground.

Deterministic (fixed seed) and pure standard library. Writes:

* data/prompts/train.jsonl, data/prompts/heldout.jsonl
    {"id": "<kind>-<n>", "kind": "<kind>", "prompt": "<text>"}
* data/prompts/known_answers.jsonl
    {"id", "kind": "arithmetic" | "capital", "prompt", "answer"}
* assets/examples.json
    [{"label", "prompt"}, ...]  (12 examples for the web app's picker)

Prompts are made by combining hand-written templates with hand-written filler
lists.  All randomness comes from ``random.Random`` instances seeded with
fixed strings, and nothing iterates over a ``set`` of strings, so the output
is byte-identical on every run (independent of PYTHONHASHSEED).

Usage:  python -m tools.build_prompts
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

SEED = "mars-playground-prompts-v1"
KINDS = [
    "facts",
    "lists",
    "definitions",
    "explanations",
    "howto",
    "creative",
    "math",
    "code",
    "rewrite",
    "translate",
]
PER_KIND = 350  # prompts kept per kind (train + heldout)
HELDOUT_PER_KIND = 15  # 10 kinds x 15 = 150 held-out prompts
MAX_WORDS = 40

ROOT = Path(__file__).resolve().parent.parent
PROMPTS_DIR = ROOT / "data" / "prompts"
EXAMPLES_PATH = ROOT / "assets" / "examples.json"


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def norm(text: str) -> str:
    """Case- and whitespace-normalised form used for all dedup/overlap checks."""
    return " ".join(text.lower().split())


def rng_for(tag: str) -> random.Random:
    # String seeds are hashed with SHA-512 by random.seed(), so this is
    # stable across processes and Python versions.
    return random.Random(f"{SEED}:{tag}")


def dedup(items: list[str]) -> list[str]:
    seen: dict[str, None] = {}
    out = []
    for item in items:
        key = norm(item)
        if key not in seen:
            seen[key] = None
            out.append(item)
    return out


def combos(rng: random.Random, templates: list[str], fillers: list, per_item: int) -> list[str]:
    """For every filler, render ``per_item`` randomly chosen templates.

    A filler is either a string (substituted for ``{x}``) or a dict of fields.
    """
    out = []
    k = min(per_item, len(templates))
    for filler in fillers:
        fields = filler if isinstance(filler, dict) else {"x": filler}
        for template in rng.sample(templates, k):
            out.append(template.format(**fields))
    return out


def pick(rng: random.Random, candidates: list[str], n: int) -> list[str]:
    candidates = dedup(candidates)
    if len(candidates) <= n:
        return candidates
    return rng.sample(candidates, n)


def cap(sentence: str) -> str:
    return sentence[0].upper() + sentence[1:]


def third_person(verb_phrase: str) -> str:
    """'reverse a string' -> 'reverses a string' (first word only)."""
    verb, _, rest = verb_phrase.partition(" ")
    if verb.endswith(("s", "sh", "ch", "x", "z")):
        verb += "es"
    elif verb.endswith("y") and verb[-2] not in "aeiou":
        verb = verb[:-1] + "ies"
    else:
        verb += "s"
    return f"{verb} {rest}" if rest else verb


NUMBER_WORDS = {3: "three", 4: "four", 5: "five", 6: "six"}


# --------------------------------------------------------------------------
# shared filler lists
# --------------------------------------------------------------------------

# (country as used mid-sentence, continent or None if transcontinental, main language or None)
COUNTRIES = [
    ("France", "Europe", "French"),
    ("Germany", "Europe", "German"),
    ("Italy", "Europe", "Italian"),
    ("Spain", "Europe", "Spanish"),
    ("Portugal", "Europe", "Portuguese"),
    ("Greece", "Europe", "Greek"),
    ("Norway", "Europe", "Norwegian"),
    ("Sweden", "Europe", "Swedish"),
    ("Finland", "Europe", "Finnish"),
    ("Denmark", "Europe", "Danish"),
    ("Poland", "Europe", "Polish"),
    ("Austria", "Europe", "German"),
    ("Hungary", "Europe", "Hungarian"),
    ("the Czech Republic", "Europe", "Czech"),
    ("Ireland", "Europe", None),
    ("the United Kingdom", "Europe", "English"),
    ("Romania", "Europe", "Romanian"),
    ("Bulgaria", "Europe", "Bulgarian"),
    ("Croatia", "Europe", "Croatian"),
    ("Serbia", "Europe", "Serbian"),
    ("Iceland", "Europe", "Icelandic"),
    ("Estonia", "Europe", "Estonian"),
    ("Latvia", "Europe", "Latvian"),
    ("Lithuania", "Europe", "Lithuanian"),
    ("Slovakia", "Europe", "Slovak"),
    ("Slovenia", "Europe", "Slovenian"),
    ("Ukraine", "Europe", "Ukrainian"),
    ("Belgium", "Europe", None),
    ("the Netherlands", "Europe", "Dutch"),
    ("Switzerland", "Europe", None),
    ("Turkey", None, "Turkish"),
    ("Russia", None, "Russian"),
    ("Japan", "Asia", "Japanese"),
    ("China", "Asia", None),
    ("South Korea", "Asia", "Korean"),
    ("India", "Asia", None),
    ("Thailand", "Asia", "Thai"),
    ("Vietnam", "Asia", "Vietnamese"),
    ("the Philippines", "Asia", None),
    ("Indonesia", "Asia", "Indonesian"),
    ("Malaysia", "Asia", "Malay"),
    ("Pakistan", "Asia", None),
    ("Bangladesh", "Asia", "Bengali"),
    ("Nepal", "Asia", "Nepali"),
    ("Iran", "Asia", "Persian"),
    ("Iraq", "Asia", "Arabic"),
    ("Saudi Arabia", "Asia", "Arabic"),
    ("Jordan", "Asia", "Arabic"),
    ("Lebanon", "Asia", "Arabic"),
    ("Cambodia", "Asia", "Khmer"),
    ("Laos", "Asia", "Lao"),
    ("Mongolia", "Asia", "Mongolian"),
    ("Egypt", "Africa", "Arabic"),
    ("Kenya", "Africa", None),
    ("Nigeria", "Africa", None),
    ("Ethiopia", "Africa", None),
    ("Morocco", "Africa", None),
    ("Ghana", "Africa", None),
    ("Senegal", "Africa", None),
    ("Algeria", "Africa", None),
    ("Tunisia", "Africa", None),
    ("Uganda", "Africa", None),
    ("Zimbabwe", "Africa", None),
    ("Zambia", "Africa", None),
    ("Madagascar", "Africa", None),
    ("Canada", "North America", None),
    ("the United States", "North America", None),
    ("Mexico", "North America", "Spanish"),
    ("Cuba", "North America", "Spanish"),
    ("Jamaica", "North America", "English"),
    ("Panama", "North America", "Spanish"),
    ("Argentina", "South America", "Spanish"),
    ("Brazil", "South America", "Portuguese"),
    ("Chile", "South America", "Spanish"),
    ("Peru", "South America", "Spanish"),
    ("Colombia", "South America", "Spanish"),
    ("Venezuela", "South America", "Spanish"),
    ("Uruguay", "South America", "Spanish"),
    ("Ecuador", "South America", "Spanish"),
    ("Australia", "Oceania", "English"),
    ("New Zealand", "Oceania", None),
]

# Capitals used ONLY for known-answer questions: well known and unambiguous
# (no multiple/contested capitals, no accented or variant spellings).
# (country, capital, search string)
KNOWN_CAPITALS = [
    ("France", "Paris", "Paris"),
    ("Japan", "Tokyo", "Tokyo"),
    ("Italy", "Rome", "Rome"),
    ("Germany", "Berlin", "Berlin"),
    ("Spain", "Madrid", "Madrid"),
    ("Egypt", "Cairo", "Cairo"),
    ("Canada", "Ottawa", "Ottawa"),
    ("Australia", "Canberra", "Canberra"),
    ("Russia", "Moscow", "Moscow"),
    ("China", "Beijing", "Beijing"),
    ("India", "New Delhi", "Delhi"),
    ("the United Kingdom", "London", "London"),
    ("Ireland", "Dublin", "Dublin"),
    ("Portugal", "Lisbon", "Lisbon"),
    ("Greece", "Athens", "Athens"),
    ("Norway", "Oslo", "Oslo"),
    ("Sweden", "Stockholm", "Stockholm"),
    ("Finland", "Helsinki", "Helsinki"),
    ("Denmark", "Copenhagen", "Copenhagen"),
    ("Poland", "Warsaw", "Warsaw"),
    ("Austria", "Vienna", "Vienna"),
    ("Hungary", "Budapest", "Budapest"),
    ("the Czech Republic", "Prague", "Prague"),
    ("Belgium", "Brussels", "Brussels"),
    ("Argentina", "Buenos Aires", "Buenos Aires"),
    ("Mexico", "Mexico City", "Mexico City"),
    ("Peru", "Lima", "Lima"),
    ("Chile", "Santiago", "Santiago"),
    ("Kenya", "Nairobi", "Nairobi"),
    ("Thailand", "Bangkok", "Bangkok"),
    ("Vietnam", "Hanoi", "Hanoi"),
    ("South Korea", "Seoul", "Seoul"),
    ("the Philippines", "Manila", "Manila"),
    ("Turkey", "Ankara", "Ankara"),
    ("Iran", "Tehran", "Tehran"),
    ("Iraq", "Baghdad", "Baghdad"),
    ("Saudi Arabia", "Riyadh", "Riyadh"),
    ("Cuba", "Havana", "Havana"),
    ("Romania", "Bucharest", "Bucharest"),
    ("Serbia", "Belgrade", "Belgrade"),
    ("Croatia", "Zagreb", "Zagreb"),
    ("Pakistan", "Islamabad", "Islamabad"),
    ("Afghanistan", "Kabul", "Kabul"),
    ("Nepal", "Kathmandu", "Kathmandu"),
    ("Morocco", "Rabat", "Rabat"),
    ("Ghana", "Accra", "Accra"),
    ("Venezuela", "Caracas", "Caracas"),
    ("Uruguay", "Montevideo", "Montevideo"),
    ("Ecuador", "Quito", "Quito"),
    ("Lebanon", "Beirut", "Beirut"),
    ("Syria", "Damascus", "Damascus"),
    ("Jordan", "Amman", "Amman"),
    ("New Zealand", "Wellington", "Wellington"),
    ("Estonia", "Tallinn", "Tallinn"),
    ("Latvia", "Riga", "Riga"),
    ("Ethiopia", "Addis Ababa", "Addis Ababa"),
    ("Bangladesh", "Dhaka", "Dhaka"),
    ("Cambodia", "Phnom Penh", "Phnom Penh"),
]

NAMES = [
    ("Maria", "she"), ("Tom", "he"), ("Aisha", "she"), ("Leo", "he"),
    ("Sofia", "she"), ("Ben", "he"), ("Yuki", "she"), ("Carlos", "he"),
    ("Emma", "she"), ("Omar", "he"), ("Priya", "she"), ("Jack", "he"),
    ("Lena", "she"), ("Sam", "he"), ("Chloe", "she"), ("Noah", "he"),
    ("Hana", "she"), ("Lucas", "he"), ("Grace", "she"), ("Mateo", "he"),
]

ITEMS = [
    "apples", "marbles", "stickers", "cookies", "books", "pencils", "cards",
    "stamps", "eggs", "balloons", "oranges", "seashells", "crayons", "candies",
    "toy cars", "flowers", "coins", "cupcakes", "buttons", "postcards",
]


# --------------------------------------------------------------------------
# facts
# --------------------------------------------------------------------------

BOOKS = [
    ("Hamlet", "play"), ("Romeo and Juliet", "play"), ("Macbeth", "play"),
    ("A Midsummer Night's Dream", "play"), ("Pride and Prejudice", "novel"),
    ("1984", "novel"), ("Animal Farm", "novel"), ("To Kill a Mockingbird", "novel"),
    ("The Great Gatsby", "novel"), ("Moby-Dick", "novel"), ("War and Peace", "novel"),
    ("Don Quixote", "novel"), ("The Odyssey", "epic poem"), ("Frankenstein", "novel"),
    ("Dracula", "novel"), ("Jane Eyre", "novel"), ("Wuthering Heights", "novel"),
    ("Great Expectations", "novel"), ("Oliver Twist", "novel"),
    ("A Christmas Carol", "story"), ("The Hobbit", "novel"),
    ("The Lord of the Rings", "novel"), ("The Little Prince", "book"),
    ("Alice's Adventures in Wonderland", "book"),
    ("The Adventures of Tom Sawyer", "novel"), ("Crime and Punishment", "novel"),
    ("Anna Karenina", "novel"), ("Les Misérables", "novel"),
    ("The Old Man and the Sea", "novel"), ("Of Mice and Men", "novel"),
    ("The Catcher in the Rye", "novel"), ("Brave New World", "novel"),
    ("Fahrenheit 451", "novel"), ("One Hundred Years of Solitude", "novel"),
    ("The Raven", "poem"), ("On the Origin of Species", "book"),
    ("A Brief History of Time", "book"), ("The Art of War", "book"),
    ("Charlotte's Web", "book"), ("Treasure Island", "novel"),
    ("The Jungle Book", "book"), ("Gulliver's Travels", "book"),
    ("Robinson Crusoe", "novel"), ("Little Women", "novel"),
    ("The Canterbury Tales", "book"), ("Matilda", "book"),
    ("The Hunger Games", "novel"), ("Sherlock Holmes stories", None),
]

PAINTINGS = [
    "the Mona Lisa", "The Starry Night", "The Last Supper", "The Scream",
    "Guernica", "Girl with a Pearl Earring", "The Persistence of Memory",
    "The Birth of Venus", "The Night Watch", "American Gothic",
    "the ceiling of the Sistine Chapel", "The Great Wave off Kanagawa",
]

MUSIC = [
    "the Moonlight Sonata", "The Four Seasons", "The Magic Flute", "Swan Lake",
    "The Nutcracker", "Für Elise", "The Blue Danube", "Clair de Lune",
    "The Marriage of Figaro", "the opera Carmen",
]

INVENTIONS = [
    "the telephone", "the light bulb", "the printing press", "the World Wide Web",
    "the airplane", "the radio", "dynamite", "the television", "the phonograph",
    "the periodic table", "the computer mouse", "the polio vaccine",
    "the steam locomotive", "the first practical telescope", "braille",
]

FIGURES = [
    "Albert Einstein", "Marie Curie", "Isaac Newton", "Leonardo da Vinci",
    "Napoleon Bonaparte", "Cleopatra", "Julius Caesar", "Mahatma Gandhi",
    "Nelson Mandela", "Martin Luther King Jr.", "Abraham Lincoln",
    "George Washington", "Winston Churchill", "Queen Victoria", "Genghis Khan",
    "Alexander the Great", "Galileo Galilei", "Charles Darwin",
    "William Shakespeare", "Wolfgang Amadeus Mozart", "Ludwig van Beethoven",
    "Florence Nightingale", "Joan of Arc", "Christopher Columbus", "Marco Polo",
    "Ada Lovelace", "Alan Turing", "Nikola Tesla", "Thomas Edison", "Confucius",
    "Socrates", "Aristotle", "Pablo Picasso", "Vincent van Gogh", "Frida Kahlo",
    "Rosa Parks", "Amelia Earhart", "Neil Armstrong", "Yuri Gagarin",
    "Louis Pasteur", "Gregor Mendel", "Johannes Gutenberg", "Michelangelo",
    "Charles Dickens", "Jane Austen", "Catherine the Great", "Simón Bolívar",
    "Harriet Tubman", "Benjamin Franklin", "Stephen Hawking",
    "Rosalind Franklin", "Ibn Battuta", "Archimedes", "Pythagoras",
    "Hippocrates", "Queen Elizabeth I", "Sigmund Freud", "Frederick Douglass",
]

WILD_ANIMALS = [
    "lions", "elephants", "giraffes", "penguins", "dolphins", "koalas",
    "kangaroos", "polar bears", "giant pandas", "zebras", "cheetahs", "owls",
    "bats", "wolves", "foxes", "octopuses", "sharks", "whales", "camels",
    "hippos", "gorillas", "flamingos", "sea turtles", "eagles", "hedgehogs",
    "beavers", "sea otters", "squirrels", "frogs", "crocodiles", "deer",
    "parrots", "honeybees", "ants", "hummingbirds", "jellyfish", "sloths",
]

ELEMENTS = [
    "hydrogen", "helium", "carbon", "nitrogen", "oxygen", "sodium", "potassium",
    "iron", "gold", "silver", "copper", "calcium", "magnesium", "zinc", "lead",
    "mercury", "tin", "uranium", "neon", "chlorine", "sulfur", "aluminum",
    "silicon", "nickel", "platinum", "iodine", "lithium", "titanium",
]

PLANETS = ["Mercury", "Venus", "Mars", "Jupiter", "Saturn", "Uranus", "Neptune"]

CITIES = [
    "Sydney", "Toronto", "Barcelona", "Munich", "Milan", "Venice", "Marseille",
    "Istanbul", "Rio de Janeiro", "São Paulo", "Mumbai", "Shanghai", "Osaka",
    "Kyoto", "Chicago", "Los Angeles", "Vancouver", "Melbourne", "Cape Town",
    "Casablanca", "Manchester", "Edinburgh", "Geneva", "Zurich", "Krakow",
    "Florence", "Seville", "Porto", "Hamburg", "Dubai", "Marrakech", "Lagos",
    "Auckland", "Saint Petersburg", "Chennai", "Ho Chi Minh City", "Busan",
    "Alexandria", "Naples", "Lyon", "Salzburg", "Bergen", "Antwerp",
    "Rotterdam", "Montreal", "Cancún", "Bangalore", "Glasgow",
]

CONTINENTS = ["Africa", "Asia", "Europe", "South America", "North America", "Oceania"]

MISC_FACTS = [
    "At what temperature does water boil at sea level?",
    "How many days are there in a leap year?",
    "What is the largest ocean on Earth?",
    "What is the smallest planet in our solar system?",
    "Which planet is closest to the Sun?",
    "How many continents are there?",
    "What is the hardest natural substance?",
    "What gas do plants absorb from the air?",
    "How many bones are in the adult human body?",
    "What is the largest organ of the human body?",
    "How many hearts does an octopus have?",
    "How many legs does a spider have?",
    "What is the fastest land animal?",
    "What is the largest mammal in the world?",
    "Which bird is the largest in the world?",
    "Who was the first person to walk on the Moon?",
    "Who was the first person to travel into space?",
    "Who discovered penicillin?",
    "Who developed the theory of relativity?",
    "Who discovered radium and polonium?",
    "In which year did World War II end?",
    "In which year did the Berlin Wall fall?",
    "When did the Titanic sink?",
    "Where were the first modern Olympic Games held?",
    "How often are the Summer Olympic Games held?",
    "What is the longest river in the world?",
    "What is the tallest mountain on Earth?",
    "What is the deepest point in the ocean?",
    "Which country has the largest population?",
    "What is the largest country by area?",
    "What is the smallest country in the world?",
    "What is the freezing point of water in Fahrenheit?",
    "How many minutes are in a day?",
    "How many sides does a hexagon have?",
    "What is the main gas in the Earth's atmosphere?",
    "What is the center of an atom called?",
    "What planet is known for its rings?",
    "How long does it take the Earth to orbit the Sun?",
    "How long does light from the Sun take to reach Earth?",
    "What is the chemical formula for water?",
    "What is the currency of Japan?",
    "How many strings does a standard guitar have?",
    "How many players are on a soccer team on the field?",
    "How many keys does a standard piano have?",
    "What language has the most native speakers?",
    "Which blood type is known as the universal donor?",
    "What vitamin does the body make from sunlight?",
    "Which organ pumps blood through the body?",
    "What is the largest desert in the world?",
    "Which country gifted the Statue of Liberty to the United States?",
    "In which city is the Eiffel Tower?",
    "In which country are the pyramids of Giza?",
    "Where is Machu Picchu located?",
    "In which country is the Taj Mahal?",
    "How long is the Great Wall of China?",
    "What is the largest rainforest in the world?",
    "What is the boiling point of water in Fahrenheit?",
    "How many teeth does an adult human usually have?",
    "How many colors are in a rainbow?",
    "Which metal is liquid at room temperature?",
]


def gen_facts() -> list[str]:
    r = rng_for("facts")
    out: list[str] = []

    capital_t = [
        "What is the capital of {c}?",
        "Which city is the capital of {c}?",
        "What is the capital city of {c}?",
        "Can you tell me the capital of {c}?",
    ]
    country_t = [
        "What currency is used in {c}?",
        "What is {c} famous for?",
        "What is the national dish of {c}?",
        "How many people live in {c}, roughly?",
    ]
    cands = []
    for country, continent, language in COUNTRIES:
        templates = capital_t + country_t
        if continent:
            templates = templates + ["Which continent is {c} in?", "On which continent is {c} located?"]
        if language:
            templates = templates + ["What language is spoken in {c}?", "What is the main language of {c}?"]
        cands += combos(r, templates, [{"c": country}], 2)
    out += pick(r, cands, 85)

    book_t = ["Who wrote {w}?", "Who is the author of {w}?", "Who wrote the {t} {w}?", "When was {w} written?"]
    cands = []
    for work, typ in BOOKS:
        ts = book_t if typ else ["Who wrote the {w}?", "Who created the {w}?"]
        cands += combos(r, ts, [{"w": work, "t": typ}], 2)
    out += pick(r, cands, 50)

    cands = combos(r, ["Who painted {x}?", "Which artist painted {x}?"], PAINTINGS, 1)
    cands += combos(r, ["Who composed {x}?", "Which composer wrote {x}?"], MUSIC, 1)
    cands += combos(r, ["Who invented {x}?", "Who is credited with inventing {x}?"], INVENTIONS, 1)
    out += pick(r, cands, 35)

    fig_t = [
        "Who was {x}?",
        "What is {x} famous for?",
        "What is {x} best known for?",
        "Tell me briefly who {x} was.",
        "Why is {x} remembered today?",
    ]
    out += pick(r, combos(r, fig_t, FIGURES, 1), 55)

    animal_t = [
        "What do {x} eat?",
        "Where do {x} live in the wild?",
        "How long do {x} usually live?",
        "What is a group of {x} called?",
    ]
    out += pick(r, combos(r, animal_t, WILD_ANIMALS, 2), 45)

    el_t = ["What is the chemical symbol for {x}?", "What is the atomic number of {x}?", "Is {x} a metal?"]
    cands = combos(r, el_t, ELEMENTS, 1)
    planet_t = ["How many moons does {x} have?", "How long is a year on {x}?", "What is the surface of {x} like?", "How far is {x} from the Sun?"]
    cands += combos(r, planet_t, PLANETS, 2)
    out += pick(r, cands, 35)

    city_t = ["Which country is {x} in?", "In which country is the city of {x}?", "{x} is a city in which country?"]
    cands = combos(r, city_t, CITIES, 1)
    cont_t = [
        "What is the longest river in {x}?",
        "What is the highest mountain in {x}?",
        "What is the largest country in {x}?",
        "What is the largest city in {x}?",
    ]
    cands += combos(r, cont_t, CONTINENTS, 3)
    out += pick(r, cands, 40)

    out += MISC_FACTS
    return out


# --------------------------------------------------------------------------
# lists
# --------------------------------------------------------------------------

LIST_CATEGORIES = [
    "fruits that are red", "animals that live in the ocean", "countries in South America",
    "musical instruments with strings", "vegetables that are green", "birds that cannot fly",
    "things you can find in a kitchen", "sports played with a ball", "planets in our solar system",
    "programming languages", "board games", "famous scientists", "kinds of trees", "types of clouds",
    "items you need for a picnic", "jobs in a hospital", "animals that hibernate",
    "desserts made with chocolate", "herbs used in cooking", "breakfast foods", "winter sports",
    "dog breeds", "types of pasta", "fruits that grow on trees", "animals found in Africa",
    "insects", "reptiles", "gemstones", "mammals that live in water", "things that are yellow",
    "hobbies you can do at home", "healthy snacks", "renewable energy sources", "kitchen utensils",
    "tools used in gardening", "music genres", "team sports", "common pets", "farm animals",
    "parts of a plant", "parts of a computer", "units of length", "school subjects", "fairy tales",
    "Greek gods", "famous painters", "things to do on a rainy day", "foods that are high in protein",
    "foods rich in vitamin C", "vegetables that grow underground", "materials that conduct electricity",
    "things that float on water", "flowers that bloom in spring", "houseplants that are easy to care for",
    "citrus fruits", "ancient civilizations", "constellations", "card games", "martial arts",
    "European capitals", "countries in Asia", "large cities in the United States",
    "animals that live in the Arctic", "nocturnal animals", "appliances found in most homes",
    "ways to be kind to a neighbor", "good habits for students", "ways to save water at home",
    "ways to reduce stress", "things that are made of glass", "shapes with straight sides",
    "famous inventors", "types of bread", "spices used in Indian cooking", "types of cheese",
    "summer fruits", "ocean fish", "musical instruments in an orchestra", "types of weather",
    "words that describe a sunny day", "things you should pack for a beach trip",
    "things that are soft", "games children play outside", "popular cat names",
    "animals with stripes", "famous rivers", "mountain ranges", "types of boats",
    "holidays celebrated around the world", "colors that start with the letter B",
]

TIPS_FOR = [
    "staying focused while studying", "sleeping better", "saving money on groceries",
    "learning a new language", "staying healthy in winter", "preparing for a job interview",
    "writing a good essay", "keeping a houseplant alive", "making new friends in a new city",
    "staying safe while hiking", "reducing screen time", "speaking in public",
    "starting to run", "eating more vegetables", "keeping a clean kitchen",
    "traveling on a budget", "remembering names", "managing time at work",
    "taking better photos with a phone", "staying calm before an exam", "waking up early",
    "drinking more water", "keeping a journal", "decluttering a small apartment",
    "working from home", "learning to play the guitar", "reading more books",
    "being a good listener", "packing light for a trip", "cooking for one person",
    "staying cool in hot weather", "writing a clear email", "protecting your privacy online",
    "caring for a new puppy", "studying math", "making a long drive less tiring",
    "running a good meeting", "keeping kids busy on a rainy day",
]

LIST_COUNTRIES = [
    "France", "Italy", "Japan", "Spain", "Mexico", "India", "Brazil", "Greece", "Egypt",
    "Canada", "Germany", "China", "Peru", "Thailand", "Turkey", "Morocco", "Australia",
    "the United Kingdom", "Vietnam", "Portugal", "Ireland", "South Korea", "Kenya", "Argentina",
]

RHYME_WORDS = [
    "cat", "light", "day", "sun", "tree", "star", "rain", "moon", "bed", "blue", "cake",
    "ring", "fun", "house", "cold", "night", "book", "snow", "fish", "heart", "sky", "sea",
    "game", "door", "bright", "frog", "hat", "time", "play", "sing",
]

ADJECTIVES = [
    "happy", "big", "fast", "smart", "sad", "angry", "beautiful", "cold", "small", "tired",
    "funny", "brave", "quiet", "strong", "old", "rich", "hard", "bright", "kind", "scary",
    "calm", "difficult", "important", "interesting", "clean", "busy", "hungry", "polite",
    "lazy", "shy",
]

PROS_CONS = [
    "working from home", "living in a big city", "electric cars", "owning a dog",
    "online shopping", "social media", "public transportation", "learning online",
    "living in the countryside", "renting an apartment", "solar power", "school uniforms",
    "traveling alone", "e-books", "eating out at restaurants", "smartphones for children",
    "a four-day work week", "self-driving cars", "homeschooling", "living abroad",
]


def gen_lists() -> list[str]:
    r = rng_for("lists")
    out: list[str] = []

    cat_t = [
        "List {n} {x}.",
        "Name {n} {x}.",
        "Give me {n} examples of {x}.",
        "What are {n} {x}?",
        "Can you name {n} {x}?",
        "Make a short list of {n} {x}.",
    ]
    fillers = [{"x": c, "n": NUMBER_WORDS[r.choice([3, 4, 5])]} for c in LIST_CATEGORIES]
    out += pick(r, combos(r, cat_t, fillers, 2), 150)

    tip_t = [
        "List {n} tips for {x}.",
        "Give me {n} tips for {x}.",
        "What are some tips for {x}?",
        "Can you give me {n} quick tips for {x}?",
        "Share {n} practical tips for {x}.",
    ]
    fillers = [{"x": t, "n": NUMBER_WORDS[r.choice([3, 4, 5])]} for t in TIPS_FOR]
    out += pick(r, combos(r, tip_t, fillers, 2), 70)

    country_t = [
        "List {n} famous landmarks in {x}.",
        "Name {n} traditional dishes from {x}.",
        "Name {n} big cities in {x}.",
        "List {n} things tourists love to do in {x}.",
    ]
    fillers = [{"x": c, "n": NUMBER_WORDS[r.choice([3, 4, 5])]} for c in LIST_COUNTRIES]
    out += pick(r, combos(r, country_t, fillers, 2), 45)

    word_t = ["List {n} words that rhyme with '{x}'.", "Give me {n} words that rhyme with '{x}'."]
    fillers = [{"x": w, "n": NUMBER_WORDS[r.choice([3, 4, 5])]} for w in RHYME_WORDS]
    cands = combos(r, word_t, fillers, 1)
    adj_t = [
        "List {n} synonyms for '{x}'.",
        "Give {n} words that mean the same as '{x}'.",
        "List {n} antonyms of '{x}'.",
        "What are {n} words that mean the opposite of '{x}'?",
    ]
    fillers = [{"x": w, "n": NUMBER_WORDS[r.choice([3, 4, 5])]} for w in ADJECTIVES]
    cands += combos(r, adj_t, fillers, 2)
    out += pick(r, cands, 70)

    pc_t = [
        "List the pros and cons of {x}.",
        "What are {n} advantages of {x}?",
        "What are {n} disadvantages of {x}?",
        "Give {n} benefits and {n} drawbacks of {x}.",
    ]
    fillers = [{"x": p, "n": "three"} for p in PROS_CONS]
    out += pick(r, combos(r, pc_t, fillers, 2), 35)

    extra = [
        "List the seven continents.",
        "List the days of the week in order.",
        "List the months of the year that have 31 days.",
        "List the primary colors.",
        "Name the planets in order from the Sun.",
        "List the four seasons and one thing people enjoy in each.",
        "List the noble gases.",
        "List the oceans of the world.",
        "Name the three states of matter.",
        "List the five senses.",
        "List the colors of the rainbow in order.",
        "List the members of the cat family you might see in a zoo.",
        "Name the Great Lakes of North America.",
        "List the vowels in the English alphabet.",
        "List the stages of the water cycle.",
        "Name the layers of the Earth.",
        "List the main food groups.",
        "List the phases of the Moon.",
        "Name the organs of the digestive system.",
        "List the parts of a flower.",
    ]
    out += extra
    return out


# --------------------------------------------------------------------------
# definitions
# --------------------------------------------------------------------------

VOCAB = [
    "ubiquitous", "ephemeral", "resilient", "ambiguous", "benevolent", "candid", "diligent",
    "eloquent", "frugal", "gregarious", "meticulous", "nostalgia", "optimistic", "pragmatic",
    "serendipity", "tenacious", "verbose", "whimsical", "zealous", "empathy", "hypothesis",
    "irony", "metaphor", "paradox", "procrastinate", "sarcasm", "skeptical", "altruism",
    "anecdote", "humble", "integrity", "jargon", "lethargic", "mundane", "novice", "obsolete",
    "plausible", "quaint", "redundant", "sustainable", "trivial", "vivid", "wary", "ambition",
    "biodegradable", "cliché", "consensus", "dilemma", "euphemism", "hesitant", "inevitable",
    "melancholy", "nuance", "onomatopoeia", "persevere", "reluctant", "spontaneous",
    "transparent", "unanimous", "vague", "versatile", "gullible", "hospitable", "impartial",
    "lenient", "naive", "oblivious", "punctual", "resourceful", "sincere", "thrifty",
    "wholesome", "curiosity", "gratitude", "courage", "mindfulness", "etiquette", "hindsight",
    "wanderlust", "alliteration",
]

TERMS = [
    "photosynthesis", "gravity", "evolution", "an atom", "a molecule", "an ecosystem",
    "inflation", "democracy", "an algorithm", "bacteria", "climate", "osmosis", "erosion",
    "friction", "a recession", "an entrepreneur", "biodiversity", "metabolism", "a vaccine",
    "cryptocurrency", "encryption", "bandwidth", "a firewall", "cloud computing",
    "machine learning", "a blockchain", "renewable energy", "a carbon footprint",
    "supply and demand", "an interest rate", "a budget", "a mortgage", "GDP", "a galaxy",
    "a black hole", "an eclipse", "a habitat", "a predator", "a fossil", "a mammal",
    "a volcano", "a constitution", "a monopoly", "a tariff", "a prime number", "a fraction",
    "an integer", "a variable", "a compiler", "an operating system", "a database",
    "a protein", "a chromosome", "an antibiotic", "a carnivore", "a peninsula", "a delta",
    "a glacier", "an archipelago", "a haiku", "a sonnet", "a metaphor in poetry",
    "an adjective", "an adverb", "a pronoun", "a stock", "a dividend", "a loan",
]

IDIOMS = [
    "break the ice", "a piece of cake", "under the weather", "spill the beans", "hit the sack",
    "once in a blue moon", "cost an arm and a leg", "let the cat out of the bag", "bite the bullet",
    "the ball is in your court", "on cloud nine", "cut corners", "hit the nail on the head",
    "call it a day", "a blessing in disguise", "beat around the bush", "when pigs fly",
    "barking up the wrong tree", "burn the midnight oil", "cry over spilled milk",
    "get cold feet", "kill two birds with one stone", "let sleeping dogs lie", "miss the boat",
    "pull someone's leg", "sit on the fence", "take it with a grain of salt", "the last straw",
    "through thick and thin", "actions speak louder than words", "the early bird catches the worm",
    "a penny for your thoughts",
]

ACRONYMS = [
    "NASA", "DNA", "CPU", "GPS", "HTML", "UNESCO", "ATM", "PDF", "USB", "FAQ", "ASAP",
    "RSVP", "DIY", "UFO", "URL", "Wi-Fi", "LED", "RAM", "NATO", "AI", "CEO", "WHO",
]

JOBS = [
    "an architect", "a pharmacist", "a paramedic", "a librarian", "an electrician", "a plumber",
    "a veterinarian", "a journalist", "a software engineer", "an accountant", "a firefighter",
    "a pilot", "a chef", "a dentist", "a lawyer", "a judge", "a nurse", "a park ranger",
    "a translator", "a graphic designer", "a data scientist", "an astronaut", "a carpenter",
    "a tailor", "a barista", "a mail carrier", "a marine biologist", "a geologist", "an editor",
    "a photographer", "a mechanic", "a real estate agent", "a zookeeper", "an archaeologist",
    "a meteorologist", "a physiotherapist", "a flight attendant", "a pharmacist's assistant",
    "a dietitian", "a social worker",
]

OBJECTS = [
    "a stethoscope", "a compass", "a thermometer", "a barometer", "a spatula", "a whisk",
    "a stapler", "a microscope", "a sextant", "an abacus", "a metronome", "a protractor",
    "a colander", "a funnel", "a trowel", "a rolling pin", "a mortar and pestle",
    "an hourglass", "a magnifying glass", "a chisel", "a wrench", "a ladle", "a sundial",
    "a tripod", "a loom", "a carabiner", "a thimble", "an anvil", "a kiln", "a scalpel",
    "a pipette", "a seismograph", "a spirit level", "a plunger", "a grater",
]


def gen_definitions() -> list[str]:
    r = rng_for("definitions")
    out: list[str] = []

    word_t = [
        "What does '{x}' mean?",
        "Define '{x}'.",
        "What is the meaning of the word '{x}'?",
        "Give a simple definition of '{x}'.",
        "What does the word '{x}' mean? Use it in a sentence.",
        "Explain the meaning of '{x}' in one sentence.",
        "Define the word '{x}' in simple terms.",
    ]
    out += pick(r, combos(r, word_t, VOCAB, 2), 120)

    term_t = [
        "What is {x}?",
        "Define {x} in simple words.",
        "Give a short definition of {x}.",
        "In one or two sentences, what is {x}?",
    ]
    # "What is {x}" reads badly for bare plural/mass nouns; use a quoted form for those.
    term_t_bare = [
        "What is meant by '{x}'?",
        "Define '{x}' in simple words.",
        "Give a short definition of '{x}'.",
        "What does the term '{x}' mean?",
    ]
    cands = []
    for term in TERMS:
        ts = term_t if term.startswith(("a ", "an ")) else term_t_bare
        cands += combos(r, ts, [term], 2)
    out += pick(r, cands, 100)

    idiom_t = [
        "What does the idiom '{x}' mean?",
        "What does the phrase '{x}' mean?",
        "Explain the expression '{x}'.",
        "What is the meaning of '{x}'? Give an example.",
    ]
    out += pick(r, combos(r, idiom_t, IDIOMS, 2), 45)

    acr_t = ["What does {x} stand for?", "What does the abbreviation {x} mean?"]
    out += pick(r, combos(r, acr_t, ACRONYMS, 1), 22)

    job_t = [
        "What does {x} do?",
        "Describe what {x} does in two sentences.",
        "What is the job of {x}?",
    ]
    out += pick(r, combos(r, job_t, JOBS, 2), 50)

    obj_t = ["What is {x} used for?", "What is {x}, and what is it used for?"]
    out += pick(r, combos(r, obj_t, OBJECTS, 2), 45)
    return out


# --------------------------------------------------------------------------
# explanations
# --------------------------------------------------------------------------

WHY = [
    "the sky is blue", "leaves change color in autumn", "the ocean is salty", "we have seasons",
    "ice floats on water", "cats purr", "we need sleep", "the Moon seems to change shape",
    "bread rises", "people yawn", "metal feels colder than wood", "birds migrate",
    "onions make you cry", "the Sun rises in the east", "plants need sunlight",
    "exercise is good for your health", "we get goosebumps", "sunsets are often red",
    "stars twinkle", "we see lightning before we hear thunder", "apples turn brown after cutting",
    "popcorn pops", "the Earth has a magnetic field", "hot air rises", "we have leap years",
    "soap removes grease", "salt melts ice on roads", "some animals hibernate",
    "fingers wrinkle in water", "the Dead Sea is so salty", "airplanes leave white trails",
    "the Moon causes tides", "deserts get cold at night", "a boat made of steel can float",
    "our voices sound different on recordings", "dogs pant", "we get hiccups",
    "the ocean looks blue", "bubbles are round", "mountains are cold at the top",
    "the Earth is round", "zebras have stripes", "coffee keeps people awake",
    "we sweat when it is hot", "the days are shorter in winter", "rubber bounces",
    "snowflakes have six sides", "paper turns yellow over time", "cut grass smells fresh",
    "baking soda makes cakes rise",
]

HOW_WORKS = [
    "a refrigerator", "a compass", "a microwave oven", "the internet", "a solar panel",
    "a vaccine", "a thermometer", "an airplane wing", "a battery", "a digital camera", "GPS",
    "a heat pump", "a bicycle gear system", "the human heart", "an electric motor",
    "a touchscreen", "a lock", "Wi-Fi", "a search engine", "a credit card",
    "a hot air balloon", "a submarine", "a telescope", "a wind turbine", "a rocket engine",
    "a toaster", "a pressure cooker", "noise cancellation in headphones", "a QR code",
    "an elevator", "a dishwasher", "a smoke detector", "a barcode scanner", "a fridge magnet",
    "a thermostat", "a hydroelectric dam", "a seatbelt", "email", "a password manager",
    "a loudspeaker",
]

CAUSES = [
    "earthquakes", "thunder", "rainbows", "ocean tides", "hiccups", "rust", "volcanic eruptions",
    "fog", "lightning", "wind", "inflation", "the northern lights", "ocean waves",
    "a solar eclipse", "jet lag", "muscle cramps", "acid rain", "droughts", "static electricity",
    "sunburn", "food to spoil", "tsunamis", "hail", "dew on the grass in the morning",
    "a brain freeze", "allergies", "bad breath", "the seasons", "day and night", "echoes",
]

DIFFERENCES = [
    ("weather", "climate"), ("a virus", "a bacterium"), ("an alligator", "a crocodile"),
    ("a frog", "a toad"), ("speed", "velocity"), ("mass", "weight"), ("RAM", "storage"),
    ("a lake", "a pond"), ("a hurricane", "a tornado"), ("a simile", "a metaphor"),
    ("a meteor", "a meteorite"), ("a planet", "a star"), ("baking soda", "baking powder"),
    ("a fruit", "a vegetable"), ("an ocean", "a sea"), ("a debit card", "a credit card"),
    ("a cold", "the flu"), ("a turtle", "a tortoise"), ("a rabbit", "a hare"),
    ("a moth", "a butterfly"), ("a city", "a town"), ("a hill", "a mountain"),
    ("an atom", "a molecule"), ("a democracy", "a monarchy"), ("an app", "a website"),
    ("a noun", "a verb"), ("a dolphin", "a porpoise"), ("a comet", "an asteroid"),
    ("a violin", "a viola"), ("a herbivore", "a carnivore"), ("a cave", "a cavern"),
    ("socialism", "capitalism"), ("a hypothesis", "a theory"), ("a river", "a stream"),
    ("a seal", "a sea lion"), ("a poem", "a song"), ("a loan", "a grant"),
    ("hardware", "software"), ("a browser", "a search engine"), ("jam", "jelly"),
]

IMPORTANT = [
    "sleep", "regular exercise", "drinking enough water", "recycling", "biodiversity",
    "voting", "reading", "bees", "the ozone layer", "saving money", "washing your hands",
    "photosynthesis", "forests", "education", "teamwork", "clean water", "the water cycle",
    "a balanced diet", "protecting wetlands", "learning history", "stretching",
    "backing up your files", "good posture", "critical thinking", "a good night's sleep",
]
PLURAL_IMPORTANT = ["bees", "forests"]  # need "are"/"do" instead of "is"/"does"


def gen_explanations() -> list[str]:
    r = rng_for("explanations")
    out: list[str] = []

    why_t = [
        "Explain why {x}.",
        "Can you explain why {x}?",
        "Briefly explain why {x}.",
        "In simple terms, explain why {x}.",
        "Explain to a ten-year-old why {x}.",
        "Why is it that {x}? Explain briefly.",
    ]
    out += pick(r, combos(r, why_t, WHY, 3), 110)

    how_t = [
        "How does {x} work?",
        "Explain how {x} works.",
        "Briefly explain how {x} works.",
        "Can you explain in simple terms how {x} works?",
    ]
    out += pick(r, combos(r, how_t, HOW_WORKS, 3), 80)

    cause_t = ["What causes {x}?", "Explain what causes {x}.", "Briefly explain what causes {x}."]
    out += pick(r, combos(r, cause_t, CAUSES, 2), 55)

    diff_t = [
        "What is the difference between {a} and {b}?",
        "Explain the difference between {a} and {b}.",
        "How is {a} different from {b}?",
    ]
    fillers = [{"a": a, "b": b} for a, b in DIFFERENCES]
    out += pick(r, combos(r, diff_t, fillers, 3), 85)

    imp_t = ["Why is {x} important?", "Explain why {x} is important.", "Why does {x} matter?"]
    imp_plural_t = ["Why are {x} important?", "Explain why {x} are important.", "Why do {x} matter?"]
    fillers = []
    for x in IMPORTANT:
        ts = imp_plural_t if x in PLURAL_IMPORTANT else imp_t
        fillers += combos(r, ts, [x], 2)
    out += pick(r, fillers, 45)
    return out


# --------------------------------------------------------------------------
# howto
# --------------------------------------------------------------------------

TASKS = [
    "boil an egg", "tie a tie", "change a flat tire", "make a cup of tea", "plant a tomato seedling",
    "clean a laptop keyboard", "write a cover letter", "make pancakes", "iron a shirt",
    "set up a new email account", "sew on a button", "start a compost pile", "make a paper airplane",
    "care for a succulent", "back up my phone", "brew coffee with a French press",
    "cook rice on the stove", "make a simple monthly budget", "unclog a sink",
    "wash a wool sweater", "fold a fitted sheet", "remove a coffee stain from a shirt",
    "clean a cast iron pan", "make homemade lemonade", "hang a picture on a wall",
    "jump-start a car", "take a screenshot on a computer", "juggle three balls",
    "tie a bowline knot", "make a fruit smoothie", "prepare for a job interview",
    "write a thank-you note", "start meditating", "clean windows without streaks",
    "make scrambled eggs", "bake chocolate chip cookies", "make a grilled cheese sandwich",
    "pack a suitcase efficiently", "organize my closet", "study for an exam",
    "train a puppy to sit", "wrap a gift neatly", "make a fruit salad", "set up a fish tank",
    "paint a room", "replace a light bulb safely", "start a vegetable garden",
    "fix a squeaky door", "make popcorn on the stove", "defrost a freezer", "patch a bike tire",
    "make a paper snowflake", "make pizza dough at home", "sharpen a kitchen knife",
    "clean a microwave", "remove a splinter", "do a proper push-up", "stretch before running",
    "plan a birthday party", "build a campfire safely", "pitch a tent", "read a paper map",
    "create a strong password", "clear my browser cache", "make my bed neatly", "polish leather shoes",
    "clean a bathroom quickly", "make guacamole", "cook pasta properly", "make a simple salad dressing",
    "roast vegetables in the oven", "make hot chocolate", "improve my handwriting",
    "memorize a short speech", "keep cut flowers fresh", "get rid of fruit flies",
    "descale a kettle", "make iced tea", "store fresh herbs", "ripen an avocado quickly",
    "peel a mango", "chop an onion", "separate an egg yolk from the white", "braid my hair",
    "make a paper boat", "fold a T-shirt neatly", "clean white sneakers", "remove rust from a tool",
    "water indoor plants correctly", "make soap bubbles at home", "build a simple birdhouse",
    "set a table for dinner", "make a cheese omelette", "brush a dog's teeth",
    "change a baby's diaper", "make a cup of pour-over coffee", "write a good resume",
    "start a daily reading habit", "clean a coffee maker", "remove chewing gum from clothes",
    "keep a sourdough starter alive", "bake a loaf of banana bread", "make overnight oats",
    "calm down before a presentation", "cook a soft-boiled egg", "freeze fresh berries",
    "make a simple tomato sauce", "install an app on my phone", "reset my Wi-Fi router",
    "write a polite complaint email", "make a bird feeder from a bottle", "clean my glasses properly",
]


def gen_howto() -> list[str]:
    r = rng_for("howto")
    templates = [
        "How do I {x}?",
        "How can I {x}?",
        "What are the steps to {x}?",
        "Give me step-by-step instructions to {x}.",
        "Explain how to {x} in a few simple steps.",
        "What is the easiest way to {x}?",
        "Can you tell me how to {x}?",
        "List the steps to {x}.",
        "I want to {x}. What should I do, step by step?",
    ]
    return combos(r, templates, TASKS, 4)


# --------------------------------------------------------------------------
# creative
# --------------------------------------------------------------------------

POEM_TOPICS = [
    "the ocean", "autumn leaves", "a rainy day", "the moon", "friendship", "a cup of coffee",
    "a lost sock", "the first snow", "a sleepy cat", "city lights at night", "a mountain sunrise",
    "spring flowers", "a busy bee", "an old bicycle", "the sound of rain", "a lighthouse",
    "summer vacation", "a garden after rain", "the stars", "a quiet library", "a thunderstorm",
    "homework", "a birthday cake", "the wind", "a river", "a forest in autumn", "Monday mornings",
    "a favorite book", "grandma's kitchen", "the desert at night", "a snowman", "a dragonfly",
    "the first day of school", "a train journey", "a campfire", "an empty beach in winter",
    "a kite", "a rainbow", "a goldfish", "a broken umbrella", "a sunflower", "the night sky",
    "a hummingbird", "a lazy Sunday", "a rooftop garden", "an old oak tree", "the sea at dawn",
    "a lonely cloud", "a dog waiting by the door", "a bowl of soup", "a full moon",
    "the last day of summer", "a new pair of shoes", "an old clock", "morning fog",
    "a mountain lake", "bread baking in the oven", "a puddle", "fireflies", "a subway ride",
    "the smell of rain", "a winter morning", "a village at night", "a paper lantern",
    "the color green", "a cup of hot chocolate", "a waterfall", "a sleepy town",
]

CHARACTERS = [
    "a lonely robot", "a brave little mouse", "a curious cat", "an old fisherman",
    "a young wizard", "a shy dragon", "a talking tree", "a clumsy knight", "a girl named Mia",
    "a boy named Leo", "a retired astronaut", "a friendly ghost", "a lost penguin",
    "a slow snail", "a baker", "a grumpy troll", "a detective dog", "a kind giant",
    "a lighthouse keeper", "a little cloud", "a forgetful wizard", "a young inventor",
    "a sleepy bear", "a pirate captain", "a squirrel", "a street musician", "a time traveler",
    "an old clockmaker", "a curious owl", "a small turtle",
]

EVENTS = [
    "finds a mysterious key", "learns to fly", "makes an unlikely friend",
    "gets lost in a big city", "discovers a hidden door", "wants to see the ocean",
    "is afraid of the dark", "wins a baking contest", "finds a map to a treasure",
    "cannot stop sneezing", "loses a favorite hat", "plants a magic seed", "meets a talking fox",
    "finds a message in a bottle", "wakes up a hundred years later",
    "tries to catch a falling star", "builds a boat out of leaves", "has to rescue a friend",
    "opens a tiny bakery", "wants to become a singer", "learns the value of patience",
    "forgets how to whistle", "is chosen to lead a parade", "finds a stray puppy",
    "travels to the Moon", "receives a strange letter", "can suddenly talk to birds",
    "has one day to save the village", "follows a glowing butterfly", "finds an old photograph",
]

LIMERICK_SUBJECTS = [
    "a cat who loves cheese", "a frog on a log", "a chef who burns everything",
    "a dog who hates baths", "a penguin in the desert", "a goat who eats homework",
    "a teacher who loses her glasses", "a snail in a hurry", "a parrot who won't stop talking",
    "a cow who wants to dance", "a pig who learns to bake", "a duck who can't swim",
    "an owl who sleeps all night", "a bear who loves honey", "a mouse who plays the piano",
    "a giraffe with a sore throat", "a fish who wants to fly", "a robot who loves jokes",
]

THEMES = [
    "hard work", "learning", "kindness", "courage", "change", "patience", "friendship",
    "failure", "teamwork", "curiosity", "gratitude", "starting over", "hope", "honesty",
    "being yourself", "small steps", "creativity", "rest",
]

SCENES = [
    "a busy market in the morning", "a quiet beach at sunset", "a snowy village",
    "a thunderstorm over the sea", "a crowded train station", "a forest after rain",
    "a cozy café on a cold day", "a city street at midnight", "a field of sunflowers",
    "a kitchen on a holiday morning", "an old library", "a mountain peak at dawn",
    "a children's playground in spring", "a harbor full of fishing boats", "a desert at noon",
    "a rainy afternoon at home", "a night sky full of stars", "a garden in full bloom",
]

DIALOGUE_PAIRS = [
    "a cat and a dog", "the Sun and the Moon", "a teacher and a student on the first day of school",
    "a coffee cup and a teapot", "a tree and the wind", "a tourist and a shopkeeper",
    "a robot and a child", "a pen and a pencil", "a customer and a waiter",
    "two squirrels preparing for winter", "a knight and a dragon", "an umbrella and a raincoat",
    "a snowman and the Sun", "two friends planning a trip",
]

RIDDLE_THINGS = [
    "a clock", "a shadow", "an egg", "a candle", "a map", "a piano", "an echo", "a towel",
    "a sponge", "a key", "a mirror", "a cloud", "a book", "a footstep", "a river", "a needle",
    "an envelope", "a rainbow",
]


def gen_creative() -> list[str]:
    r = rng_for("creative")
    out: list[str] = []

    poem_t = [
        "Write a short poem about {x}.",
        "Write a haiku about {x}.",
        "Write a four-line poem about {x}.",
        "Write a short rhyming poem about {x}.",
        "Compose a haiku about {x}.",
        "Write a short, funny poem about {x}.",
        "Write a gentle four-line poem about {x}.",
    ]
    out += pick(r, combos(r, poem_t, POEM_TOPICS, 3), 130)

    story_t = [
        "Write a short story about {c} who {e}.",
        "Tell a three-sentence story about {c} who {e}.",
        "Write a two-sentence story about {c} who {e}.",
        "Write a very short story, no more than five sentences, about {c} who {e}.",
        "Tell me a short bedtime story about {c} who {e}.",
        "Write a tiny story about {c} who {e}, with a happy ending.",
    ]
    fillers = [
        {"c": c, "e": e}
        for c in CHARACTERS
        for e in EVENTS
        if not ("talking" in c and "talking" in e)  # avoid "a talking tree who meets a talking fox"
    ]
    stories = combos(r, story_t, r.sample(fillers, 200), 1)
    out += pick(r, stories, 150)

    other = []
    other += combos(r, ["Write a limerick about {x}.", "Write a funny limerick about {x}."], LIMERICK_SUBJECTS, 2)
    other += combos(
        r,
        ["Write a motivational quote about {x}.", "Write a short, inspiring message about {x}.", "Write a two-line poem about {x}."],
        THEMES,
        2,
    )
    other += combos(
        r,
        ["Describe {x} in two vivid sentences.", "Write a short description of {x}.", "Paint a picture with words: describe {x} in three sentences."],
        SCENES,
        2,
    )
    other += combos(r, ["Write a short dialogue between {x}.", "Write a four-line conversation between {x}."], DIALOGUE_PAIRS, 2)
    other += combos(r, ["Write a riddle whose answer is {x}.", "Make up a short riddle about {x}."], RIDDLE_THINGS, 2)
    out += pick(r, other, 110)
    return out


# --------------------------------------------------------------------------
# math
# --------------------------------------------------------------------------


def arith_key(a: int, op: str, b: int) -> tuple:
    """Canonical key of an arithmetic question (commutative ops are unordered)."""
    if op in "+*":
        a, b = sorted((a, b))
    return (a, op, b)


def gen_math(excluded: dict) -> list[str]:
    """``excluded`` maps arith_key -> None for pairs used by known answers/examples."""
    r = rng_for("math")
    out: list[str] = []

    def fresh(a, op, b):
        return arith_key(a, op, b) not in excluded

    add_t = ["What is {a} + {b}?", "What is {a} plus {b}?", "Calculate {a} + {b}.", "Add {a} and {b}.",
             "What do you get when you add {a} and {b}?", "What is the sum of {a} and {b}?"]
    sub_t = ["What is {a} - {b}?", "What is {a} minus {b}?", "Subtract {b} from {a}.", "Calculate {a} - {b}.",
             "What is the difference between {a} and {b}?"]
    mul_t = ["What is {a} times {b}?", "What is {a} × {b}?", "Multiply {a} by {b}.", "Calculate {a} * {b}.",
             "What is the product of {a} and {b}?"]
    div_t = ["What is {a} divided by {b}?", "Divide {a} by {b}.", "What is {a} / {b}?", "How many times does {b} go into {a}?"]

    def gen(count, make, templates, op):
        res = []
        while len(res) < count:
            a, b = make()
            if not fresh(a, op, b):
                continue
            res.append(r.choice(templates).format(a=a, b=b))
        return res

    def add_pair():
        if r.random() < 0.6:
            return r.randint(11, 99), r.randint(11, 99)
        return r.randint(100, 999), r.randint(10, 999)

    def sub_pair():
        a = r.randint(20, 999) if r.random() < 0.5 else r.randint(20, 99)
        return a, r.randint(5, a - 1)

    def mul_pair():
        if r.random() < 0.5:
            return r.randint(2, 12), r.randint(2, 12)
        return r.randint(11, 99), r.randint(2, 9)

    def div_pair():
        b = r.randint(2, 12)
        return b * r.randint(2, 25), b

    out += gen(55, add_pair, add_t, "+")
    out += gen(45, sub_pair, sub_t, "-")
    out += gen(45, mul_pair, mul_t, "*")
    out += gen(30, div_pair, div_t, "/")

    for _ in range(22):
        p = r.choice([10, 20, 25, 50, 75, 5, 15, 30, 40, 60])
        n = r.choice([20, 40, 60, 80, 100, 120, 200, 240, 300, 400, 500, 800])
        out.append(r.choice(["What is {p}% of {n}?", "Calculate {p} percent of {n}.", "What is {p} percent of {n}?"]).format(p=p, n=n))
    for n in r.sample(range(2, 21), 10):
        out.append(r.choice(["What is {n} squared?", "What is {n} to the power of 2?"]).format(n=n))
    for n in r.sample(range(2, 16), 8):
        out.append(r.choice(["What is the square root of {s}?", "What number multiplied by itself gives {s}?"]).format(s=n * n))
    for _ in range(14):
        a, b, c = r.randint(2, 20), r.randint(2, 9), r.randint(2, 9)
        out.append(r.choice([
            "What is {a} + {b} × {c}?",
            "Calculate ({a} + {b}) × {c}.",
            "What is {a} × {b} - {c}?",
            "Calculate {a} - {b} + {c}.",
        ]).format(a=a, b=b, c=c))
    for _ in range(8):
        a, b = r.randint(2, 9), r.randint(2, 9)
        while b == a:
            b = r.randint(2, 9)
        out.append(r.choice([
            "What is {a}/{d} + {b}/{d}?",
            "Which is larger, {a}/{d} or {b}/{d}?",
        ]).format(a=min(a, b), b=max(a, b), d=10))
    for _ in range(6):
        a = round(r.uniform(1, 20), 1)
        b = round(r.uniform(1, 20), 1)
        out.append(r.choice(["What is {a} + {b}?", "Calculate {a} + {b}."]).format(a=a, b=b))

    def person():
        name, pron = r.choice(NAMES)
        return name, pron

    problems = []

    def wp(template, **nums):
        name, pron = person()
        item = r.choice(ITEMS)
        problems.append(template.format(N=name, P=cap(pron), p=pron, i=item, **nums))

    for _ in range(8):
        wp("{N} has {a} {i}. {P} buys {b} more. How many {i} does {N} have now?", a=r.randint(3, 40), b=r.randint(2, 20))
        a = r.randint(10, 50)
        wp("{N} had {a} {i} and gave {b} to a friend. How many {i} does {N} have left?", a=a, b=r.randint(2, a - 2))
        wp("A box holds {a} {i}. How many {i} are in {b} boxes?", a=r.randint(4, 15), b=r.randint(2, 9))
        wp("{N} reads {a} pages a day. How many pages will {p} read in {b} days?", a=r.randint(5, 30), b=r.randint(2, 10))
        a = r.randint(10, 40)
        wp("A bus has {a} passengers. At the next stop, {b} get off and {c} get on. How many passengers are on the bus now?",
           a=a, b=r.randint(2, a - 3), c=r.randint(1, 15))
        b = r.randint(2, 6)
        wp("There are {a} students in a class, and they work in groups of {b}. How many groups are there?", a=b * r.randint(3, 8), b=b)
        wp("A pencil costs {a} cents. How much do {b} pencils cost?", a=r.choice([15, 20, 25, 30, 35, 40, 45, 50]), b=r.randint(2, 9))
        wp("A train travels at {a} kilometers per hour. How far does it go in {b} hours?", a=r.choice([40, 50, 60, 70, 80, 90, 100, 120]), b=r.randint(2, 6))
        wp("{N} saves {a} dollars every week. How much will {p} have saved after {b} weeks?", a=r.randint(3, 25), b=r.randint(2, 12))
        a = r.randint(20, 80)
        wp("A baker made {a} muffins and sold {b} of them. How many muffins are left?", a=a, b=r.randint(5, a - 5))
        wp("A garden has {a} rows with {b} plants in each row. How many plants are there in total?", a=r.randint(3, 12), b=r.randint(3, 12))
        wp("{N} is {a} years old. How old will {p} be in {b} years?", a=r.randint(6, 40), b=r.randint(2, 15))
        b = r.choice([2, 3, 4])
        wp("A pizza is cut into {a} slices. If {b} friends share it equally, how many slices does each friend get?", a=b * r.choice([2, 3, 4]), b=b)
        wp("A rectangle is {a} cm long and {b} cm wide. What is its area?", a=r.randint(3, 20), b=r.randint(2, 12))
        wp("A rectangle is {a} cm long and {b} cm wide. What is its perimeter?", a=r.randint(3, 20), b=r.randint(2, 12))
        wp("{N} walked {a} km on Monday and {b} km on Tuesday. How many kilometers did {p} walk in total?", a=r.randint(2, 12), b=r.randint(2, 12))
        wp("If one notebook costs {a} dollars, how much do {b} notebooks cost?", a=r.randint(2, 9), b=r.randint(2, 10))
        wp("A farmer has {a} chickens and {b} cows. How many legs do the animals have in total?", a=r.randint(2, 12), b=r.randint(1, 8))
        a = r.randint(20, 100)
        wp("{N} has {a} dollars and spends {b} dollars on lunch. How much money does {p} have left?", a=a, b=r.randint(5, min(a - 1, 30)))
        wp("{N} buys {a} packs of {i}, and each pack has {b}. How many {i} does {N} have?", a=r.randint(2, 8), b=r.randint(3, 12))
    out += pick(r, problems, 150)
    return out


# --------------------------------------------------------------------------
# code
# --------------------------------------------------------------------------

CODE_TASKS = [
    "reverse a string", "check whether a number is prime", "return the largest number in a list",
    "count the vowels in a string", "compute the factorial of a number",
    "check whether a string is a palindrome", "remove duplicates from a list",
    "compute the nth Fibonacci number", "convert Celsius to Fahrenheit",
    "find the average of a list of numbers", "merge two sorted lists into one sorted list",
    "count how many times each word appears in a sentence", "capitalize the first letter of each word",
    "sum all even numbers in a list", "flatten a nested list", "check whether two strings are anagrams",
    "find the second largest number in a list", "return the longest word in a sentence",
    "convert a list of strings to uppercase", "check whether a year is a leap year",
    "compute the greatest common divisor of two numbers", "return the common elements of two lists",
    "rotate a list by k positions", "generate a list of the first n square numbers",
    "check whether a list is sorted", "count the number of digits in an integer",
    "sum the digits of a number", "convert a decimal number to binary", "remove all spaces from a string",
    "replace every vowel in a string with an asterisk", "find the index of the smallest element in a list",
    "split a list into chunks of size n", "return the median of a list of numbers",
    "calculate the area of a circle from its radius", "check whether a number is even",
    "compute simple interest", "convert minutes into hours and minutes",
    "count the uppercase letters in a string", "reverse the order of words in a sentence",
    "count how often each character appears in a string", "find all numbers divisible by 7 in a range",
    "generate a random password of a given length", "check whether a string contains only digits",
    "find the key with the largest value in a dictionary", "sort a list of tuples by the second element",
    "compute the power of a number without using **", "remove negative numbers from a list",
    "find the longest common prefix of a list of strings", "count the lines in a text file",
    "compute the product of all numbers in a list", "keep only the unique values of a list in their original order",
    "swap the keys and values of a dictionary", "check whether a number is a perfect square",
    "calculate the distance between two points", "compute BMI from weight and height",
    "print a multiplication table for a number", "find the missing number in a list of 1 to n",
    "check whether the parentheses in a string are balanced", "return the first non-repeating character in a string",
    "compress a string like 'aabbb' into 'a2b3'", "truncate a string to a given length and add '...'",
    "count the words in a sentence", "convert Fahrenheit to Celsius",
    "add up a list of numbers without using sum()", "return every other element of a list",
    "check whether all elements in a list are unique", "remove punctuation from a string",
    "return the largest of three numbers", "compute the average word length in a sentence",
    "join a list of numbers into a comma-separated string", "convert a Roman numeral to an integer",
    "check that an email address contains '@' and a dot", "calculate compound interest",
    "generate the first n prime numbers", "build a dictionary from two lists of keys and values",
    "shuffle a list without using random.shuffle", "find the mode of a list of numbers",
    "return the last n characters of a string", "check whether a sentence is a pangram",
    "convert a string to snake_case",
    "check whether a number is positive, negative, or zero", "return the initials of a full name",
    "count the even and odd numbers in a list", "find the smallest positive number in a list",
    "convert hours into seconds", "return the words in a sentence that are longer than five letters",
    "remove the first and last characters of a string", "check whether a string starts with a capital letter",
    "return the sum of the squares of a list of numbers", "convert a list of words into a single sentence",
    "calculate the total price of items in a shopping cart dictionary", "return the factors of a number",
    "check whether two lists have the same elements", "find the difference between the largest and smallest numbers in a list",
    "count the number of spaces in a string", "return a list of numbers from 1 to n that are divisible by 3 or 5",
]

PY_BUILTINS = [
    "len", "zip", "enumerate", "sorted", "map", "filter", "range", "isinstance", "any", "all",
    "sum", "min", "max", "reversed", "round", "abs", "input", "open", "set", "dict",
]

PY_QUESTIONS = [
    "What is the difference between a list and a tuple in Python?",
    "What is a list comprehension in Python? Give a short example.",
    "How do I read a text file line by line in Python?",
    "What is a dictionary in Python? Show a small example.",
    "How do I handle an exception in Python with try and except?",
    "What does the 'self' parameter mean in a Python class?",
    "How do I create a virtual environment in Python?",
    "What is the difference between '==' and 'is' in Python?",
    "How do I loop over a dictionary's keys and values in Python?",
    "What is a lambda function in Python? Give an example.",
    "How do I format a string with variables in Python using an f-string?",
    "What does 'if __name__ == \"__main__\":' do in Python?",
    "How do I sort a list of dictionaries by a key in Python?",
    "What is the difference between append() and extend() in Python?",
    "How do I check the type of a variable in Python?",
    "What is a Python generator? Show a tiny example.",
    "How do I write to a file in Python?",
    "What is the difference between a set and a list in Python?",
    "How do I convert a string to an integer in Python?",
    "What are *args and **kwargs in Python?",
    "How do I remove an item from a list in Python?",
    "What does the 'return' statement do in a Python function?",
    "How do I get the current date in Python?",
    "How do I define a simple class with one method in Python?",
    "What is the difference between a for loop and a while loop in Python?",
    "How do I import a function from another file in Python?",
    "What is slicing in Python? Give an example with a list.",
    "How do I check whether a key exists in a Python dictionary?",
    "What is a default argument in a Python function?",
    "How do I reverse a list in Python?",
    "What is the difference between a function and a method in Python?",
    "How do I round a number to two decimal places in Python?",
    "What does the 'break' statement do in a Python loop?",
    "What is the difference between local and global variables in Python?",
    "How do I join a list of strings into one string in Python?",
    "What does the 'pass' statement do in Python?",
    "How do I find the length of a string in Python?",
    "What is a module in Python?",
    "How do I make a copy of a list in Python?",
    "What is the difference between mutable and immutable objects in Python?",
    "How do I count how many times an item appears in a Python list?",
    "What does the 'in' keyword do in Python?",
    "How do I write a docstring for a Python function?",
    "How do I get user input in Python and convert it to a number?",
    "What is recursion? Show a simple example in Python.",
]

PY_SNIPPETS = [
    "print(len('hello'))", "print([x * 2 for x in range(3)])", "print('abc'[::-1])",
    "print(10 // 3)", "print(10 % 3)", "print(2 ** 5)", "print('a,b,c'.split(','))",
    "print(sorted([3, 1, 2]))", "print(list(zip([1, 2], ['a', 'b'])))", "print(sum(range(5)))",
    "print('-'.join(['x', 'y', 'z']))", "print(max('apple', 'banana'))", "print(bool([]))",
    "print([1, 2, 3][-1])", "print('Hello'.upper())", "print(type(3.0))",
    "print({'a': 1}.get('b', 0))", "print(list(range(2, 10, 3)))", "print('cat' * 3)",
    "print(round(3.14159, 2))",
]


def gen_code() -> list[str]:
    r = rng_for("code")
    out: list[str] = []
    task_t = [
        "Write a Python function that {s}.",
        "Write a Python function to {x}.",
        "Write a short Python function that {s}.",
        "Show me a Python function that {s}.",
        "How would you {x} in Python? Write a small function.",
        "Can you write a Python function that {s}?",
        "Implement a Python function that {s}.",
        "Write a Python function that {s}, with a short docstring.",
    ]
    fillers = [{"x": t, "s": third_person(t)} for t in CODE_TASKS]
    out += pick(r, combos(r, task_t, fillers, 4), 270)

    bi_t = [
        "What does the Python built-in {x}() do?",
        "Explain the Python function {x}() with a short example.",
        "How do I use {x}() in Python?",
    ]
    out += pick(r, combos(r, bi_t, PY_BUILTINS, 2), 35)
    out += PY_QUESTIONS
    snip_t = ["What does this Python code print? {x}", "What is the output of this Python line: {x}"]
    out += combos(r, snip_t, PY_SNIPPETS, 1)
    out += [
        "Fix the bug in this Python code: def add(a, b): return a - b",
        "Fix this Python code so it prints 1 to 5: for i in range(5): print(i)",
        "Why does this Python code fail? print('Total: ' + 5)",
        "Fix the bug: def is_even(n): return n % 2 == 1",
        "What is wrong with this Python code? if x = 5: print(x)",
        "Rewrite this loop as a list comprehension: result = [] then for x in nums: result.append(x * x)",
        "Fix this Python function so it returns the last item: def last(xs): return xs[len(xs)]",
        "Why does this loop never stop? i = 0; while i < 10: print(i)",
    ]
    return out


# --------------------------------------------------------------------------
# rewrite
# --------------------------------------------------------------------------

INFORMAL = [
    "hey, can u send me the report asap?", "gonna be late, traffic is crazy",
    "we need to talk about the project, it's kind of a mess", "thanks a ton for the help yesterday",
    "can't make it to the meeting, sorry", "the food was super good and the staff were awesome",
    "i think your idea is pretty cool but it needs work", "the printer's broken again, somebody fix it",
    "send me the files whenever", "we're out of coffee, can someone grab some",
    "my laptop died so i couldn't finish the homework", "the movie was kinda boring tbh",
    "let's grab lunch tomorrow if you're free", "sorry for the late reply, been super busy",
    "the new update totally broke the app", "can you check this out and tell me what you think",
    "i need the money back by friday", "this meeting could've been an email",
    "no worries, we'll figure it out", "the hotel room was tiny and kinda dirty",
    "yo, the deadline got pushed to next week", "can't find the keys anywhere, did you take them?",
    "the boss wants the slides done by tonight, no excuses",
    "gotta leave early today, dentist thing", "that presentation was awesome, great job!",
    "the wifi here is terrible, can't get anything done",
    "pls remind me about the call later", "we messed up the order, our bad",
    "i'm kinda stuck on this bug, any ideas?", "the party was a blast, you should've come",
    "can we move the call to like 4?", "this soup is way too salty",
]

BLUNT = [
    "Give me the report now.", "Your presentation was boring.", "Stop talking during the meeting.",
    "I don't want to come to your party.", "Fix this bug today.",
    "Move your car, it's blocking my driveway.", "Your music is too loud.", "You're late again.",
    "I need an answer immediately.", "That's a bad idea.", "Don't touch my stuff.",
    "Answer my email.", "Clean up your mess in the kitchen.", "We won't give you a refund.",
    "Your essay has too many mistakes.", "Be quiet, I'm working.", "You forgot to call me back.",
    "This food is cold.", "I can't help you with that.", "Send the money you owe me.",
]

COMPLEX = [
    "The meteorological forecast indicates a high probability of precipitation tomorrow.",
    "Due to unforeseen circumstances, the event has been postponed indefinitely.",
    "The committee reached a unanimous decision after extensive deliberation.",
    "Individuals who wish to participate must complete the registration form prior to the deadline.",
    "The medication should be administered twice daily following meals.",
    "Our organization is committed to facilitating sustainable growth in the region.",
    "The establishment will commence operations at nine o'clock.",
    "Please refrain from utilizing mobile devices during the performance.",
    "The vehicle sustained considerable damage in the collision.",
    "The proposal was met with widespread skepticism among stakeholders.",
    "Consumption of food and beverages is prohibited within the laboratory.",
    "The applicant possesses extensive experience in the field of data analysis.",
    "Attendance at the orientation session is mandatory for all new employees.",
    "The municipality intends to augment the frequency of public transportation services.",
    "The individual was apprehended in the vicinity of the bank.",
    "It is imperative that all participants arrive punctually.",
    "The infant exhibited signs of fatigue following the excursion.",
    "Residents are advised to minimize water consumption during the drought.",
    "The manuscript requires substantial revisions prior to publication.",
    "The athlete demonstrated exceptional endurance throughout the competition.",
    "Insufficient funding has impeded the progress of the research.",
    "The feline ascended the tree and subsequently declined to descend.",
]

PASSAGES = [
    "The city council met on Tuesday to discuss the new park. After a long debate, they agreed to build it next spring, with a playground and a small pond.",
    "Maya practiced the piano every day for a year. At the school concert, she played without a single mistake, and her teacher was very proud.",
    "Scientists found that bees can recognize human faces. They trained the bees with sugar rewards and tested them on photographs of people.",
    "The bakery on Main Street is closing after forty years. The owners want to retire, but they hope someone will buy the shop and keep it open.",
    "Heavy rain flooded several roads on Friday. Schools closed early, and the city asked people to stay home until the water went down.",
    "Our team finished the project two days early. Everyone worked hard, and the client said the final design was better than expected.",
    "A small dog followed hikers for ten miles up a mountain. When they reached the top, they shared their lunch with it and took it home.",
    "The library will start lending tools like drills and ladders. Members can borrow them for one week, just like books.",
    "Sleep helps the brain store new memories. Students who sleep well after studying usually remember more the next day.",
    "The museum added a new room about space travel. Visitors can see real rocket parts and try on a copy of an astronaut suit.",
    "Tom missed the last bus, so he walked home in the rain. On the way, he found a lost wallet and returned it to its owner.",
    "The company will let employees work from home on Fridays. Managers hope this will improve morale without hurting productivity.",
    "Plastic waste is building up in the oceans. Many countries now ban plastic bags to protect sea life.",
    "The village held its first food festival last weekend. Local cooks sold homemade dishes, and thousands of visitors came.",
    "Grandpa planted an apple tree when my mother was born. Today the tree is tall and gives the whole family fruit every autumn.",
    "The new phone has a bigger battery and a better camera. However, it costs more than the old model and is heavier.",
    "Two students built a robot that sorts recycling. It uses a camera to tell plastic from paper and won a regional science prize.",
    "The train to the coast was delayed by an hour. Passengers waited patiently, and the company offered everyone a free coffee.",
    "Walking for thirty minutes a day can improve heart health. It can also lift your mood and help you sleep better.",
    "The old bridge will be closed for repairs for three months. Drivers should use the northern road, which adds about ten minutes.",
    "Lena lost her keys on the way to work. A neighbor found them in the garden and left them in her mailbox.",
    "The school started a vegetable garden. Students grow tomatoes and beans and use them in the cafeteria.",
]

GRAMMAR = [
    "She don't like apples.", "Me and him goes to the park every day.", "Their going to the store tomorrow.",
    "I has finished my homework.", "The dogs is barking loudly.", "He runned to the bus stop.",
    "We was happy with the results.", "She can sings very well.", "Its a beautiful day outside.",
    "I seen that movie last week.", "There is many books on the shelf.", "He don't know the answer.",
    "The childs played in the yard.", "Everyone have their own opinion.", "I didn't saw anything.",
    "She buyed a new dress.", "Your the best friend I have.", "Him and me are going fishing.",
    "They was late for class.", "A apple a day keeps the doctor away.", "I am agree with you.",
    "She is more taller than her brother.", "He go to school by bus.", "The informations are correct.",
    "We discussed about the problem.", "I look forward to hear from you.", "My sister she is a doctor.",
    "Who's book is this?", "The team won they're first game.", "I goed to the beach yesterday.",
    "There cat is very fluffy.", "He have three brothers.", "The news are very surprising.",
    "I can't hardly wait for the weekend.", "Between you and I, the plan won't work.",
]

ACTIVE = [
    "The chef cooked a delicious meal.", "The students wrote the report.",
    "The wind knocked down the old tree.", "My brother painted the fence.",
    "The committee approved the new budget.", "A famous architect designed this building.",
    "The cat chased the mouse.", "The teacher graded the exams.", "The company launched a new product.",
    "Thousands of people visited the museum.", "The storm damaged several houses.",
    "Our team won the championship.", "The mechanic fixed my car.", "The children planted the trees.",
    "The police caught the thief.", "The dog dug a hole in the garden.", "My grandmother baked the cake.",
    "The mayor opened the new library.", "A bee stung my little sister.", "The volunteers cleaned the beach.",
]

PRESENT = [
    "She walks to school every morning.", "We eat dinner at seven.", "The birds sing in the garden.",
    "He writes a letter to his grandmother.", "I drink coffee before work.",
    "They play football on Saturdays.", "The sun sets behind the hills.", "My dog sleeps on the sofa.",
    "The baby cries at night.", "We swim in the lake.", "She teaches math at the local school.",
    "The train leaves at noon.", "I read the newspaper on Sundays.", "They build sandcastles on the beach.",
    "He forgets his umbrella every time.", "The shop sells fresh bread.", "We visit our cousins in July.",
    "The river flows into the sea.", "My father drives a blue truck.", "The kids ride their bikes to the park.",
]

NEUTRAL = [
    "The train was delayed because of heavy snow.", "I really enjoyed the book you recommended.",
    "The museum is closed on Mondays.", "She finished the marathon in under four hours.",
    "Our neighbors adopted a cat last week.", "The restaurant was full, so we ate at home.",
    "He forgot his passport at the hotel.", "The concert starts at eight in the evening.",
    "We walked along the river after dinner.", "The new software makes our work faster.",
    "It rained all weekend, so we stayed inside.", "My phone battery dies very quickly.",
    "The team celebrated after winning the final.", "I learned to ride a bike when I was six.",
    "The garden is full of roses in June.", "The price of coffee went up this year.",
    "The students cheered when the bell rang.", "We painted the kitchen a bright yellow.",
    "The old lighthouse still works today.", "A fox ran across the road in front of our car.",
    "The store is offering a discount on winter coats.", "The scientist explained her discovery clearly.",
]

WORDY = [
    "In my personal opinion, I think that we should probably start the meeting a little bit earlier.",
    "Due to the fact that it was raining, we made the decision to stay inside the house.",
    "At this point in time, we are not able to accept any new orders.",
    "The reason why I am writing this email is to ask about the job opening.",
    "In the event that you have any questions, please do not hesitate to contact me.",
    "It is absolutely essential that each and every student brings their own lunch.",
    "We will be meeting together in the conference room at 3 p.m. in the afternoon.",
    "She made a decision to go ahead and cancel the trip because of the fact that she was sick.",
    "There are many people who believe that exercise is very important for health.",
    "In spite of the fact that he was tired, he continued to keep working late.",
    "The report that was written by the team was very long in length.",
    "For the purpose of saving money, we have decided to cook at home more often.",
    "I would like to take this opportunity to thank all of you for coming today.",
    "It goes without saying that safety is our number one top priority.",
    "He is a man who is very kind and who always helps other people.",
    "Please be aware of the fact that the office will be closed on Friday.",
]


def gen_rewrite() -> list[str]:
    r = rng_for("rewrite")
    out: list[str] = []

    def q(templates, sentences, per_item, n):
        fillers = [{"s": s} for s in sentences]
        return pick(r, combos(r, templates, fillers, per_item), n)

    out += q([
        'Rewrite this sentence to sound more formal: "{s}"',
        'Make this more professional: "{s}"',
        'Rewrite the following in a formal tone: "{s}"',
        'Turn this casual message into a polite, formal one: "{s}"',
        'Rewrite this message so I can send it to my manager: "{s}"',
    ], INFORMAL, 3, 70)
    out += q([
        'Make this sentence more polite: "{s}"',
        'Rewrite this to sound kinder: "{s}"',
        'How could I say this more politely? "{s}"',
        'Rephrase this in a friendly, polite way: "{s}"',
    ], BLUNT, 3, 45)
    out += q([
        'Rewrite this sentence in simpler words: "{s}"',
        'Simplify this sentence: "{s}"',
        'Rewrite this so a child could understand it: "{s}"',
        'Say this in plain English: "{s}"',
    ], COMPLEX, 3, 50)
    out += q([
        'Summarize this in one sentence: "{s}"',
        'Give a short summary of this text: "{s}"',
        'Summarize in ten words or fewer: "{s}"',
        'What is the main point of this text? "{s}"',
    ], PASSAGES, 2, 44)
    out += q([
        'Fix the grammar in this sentence: "{s}"',
        'Correct the mistakes in this sentence: "{s}"',
        'Rewrite this sentence with correct grammar: "{s}"',
        'Proofread this sentence: "{s}"',
    ], GRAMMAR, 2, 45)
    out += q([
        'Rewrite this sentence in the passive voice: "{s}"',
        'Change this sentence to passive voice: "{s}"',
    ], ACTIVE, 2, 30)
    out += q([
        'Rewrite this sentence in the past tense: "{s}"',
        'Change this sentence to the past tense: "{s}"',
        'Rewrite this sentence in the future tense: "{s}"',
    ], PRESENT, 2, 35)
    out += q([
        'Paraphrase this sentence: "{s}"',
        'Rewrite this sentence in a different way: "{s}"',
        'Rewrite this sentence to make it sound more exciting: "{s}"',
        'Rewrite this sentence as a question: "{s}"',
        'Rewrite this sentence in a more formal style: "{s}"',
    ], NEUTRAL, 3, 50)
    out += q([
        'Make this sentence more concise: "{s}"',
        'Shorten this sentence without changing its meaning: "{s}"',
        'Remove the unnecessary words from this sentence: "{s}"',
    ], WORDY, 2, 30)
    return out


# --------------------------------------------------------------------------
# translate
# --------------------------------------------------------------------------

PHRASES = [
    "Good morning", "Thank you very much", "Where is the train station?",
    "I would like a cup of coffee, please.", "How much does this cost?", "My name is Anna.",
    "What time is it?", "I am learning a new language.", "The weather is nice today.",
    "Can you help me, please?", "I don't understand.", "See you tomorrow!", "Happy birthday!",
    "Where is the bathroom?", "I love this city.", "Do you speak English?",
    "The book is on the table.", "I am hungry.", "We are going to the beach.",
    "My brother has a red car.", "Excuse me, where is the nearest pharmacy?",
    "I would like to book a room for two nights.", "The museum opens at nine.", "It is raining.",
    "I have two cats.", "Nice to meet you.", "Good night", "How are you?", "Sorry, I'm late.",
    "Could I have the bill, please?", "The children are playing in the park.",
    "I live in a small apartment.", "What is your favorite color?", "This soup is delicious.",
    "Turn left at the next street.", "The store closes at eight.", "I need a doctor.",
    "Let's go to the cinema tonight.", "My phone is not working.", "She is reading a book.",
    "We have a meeting on Monday.", "The water is cold.", "I like to cook on weekends.",
    "Where do you live?", "I am a teacher.", "The cat is sleeping on the bed.",
    "Please speak more slowly.", "How do I get to the airport?", "I would like a table for four.",
    "It's very hot today.", "Welcome to our home!", "Have a nice day!",
    "I'm looking for the post office.", "Is this seat free?", "The train leaves at ten o'clock.",
    "I forgot my umbrella.", "Congratulations on your new job!", "Can I pay by card?",
    "My favorite season is spring.", "We are tired after the long trip.", "Good luck!",
    "What is this?", "I don't eat meat.", "The flowers in the garden are beautiful.",
    "I will call you later.", "Where can I buy a ticket?", "How old are you?",
    "I need more time.", "The door is open.", "He plays the guitar.", "I am from Canada.",
    "Do you have any vegetarian dishes?", "What is the Wi-Fi password?", "I lost my keys.",
    "Tomorrow is Saturday.", "The coffee is too hot.", "We like to walk by the river.",
    "Can you repeat that, please?", "The library is next to the school.",
]

WORDS = [
    "apple", "house", "dog", "cat", "book", "water", "bread", "friend", "school", "car", "sun",
    "moon", "tree", "flower", "city", "family", "window", "chair", "cheese", "milk", "rain",
    "snow", "river", "mountain", "beach", "bicycle", "kitchen", "morning", "night", "happy",
    "red", "blue", "green", "to eat", "to sleep", "to run", "butterfly", "strawberry",
    "umbrella", "teacher", "doctor", "airport", "hospital", "money", "key", "door", "shoes",
    "birthday", "love", "yesterday",
]

LANGUAGES = ["French", "Spanish", "German"]


def gen_translate() -> list[str]:
    r = rng_for("translate")
    out: list[str] = []
    phrase_t = [
        'Translate "{p}" into {l}.',
        'How do you say "{p}" in {l}?',
        'Translate this sentence to {l}: "{p}"',
        'What is "{p}" in {l}?',
        'Can you translate "{p}" into {l}?',
        'Translate from English to {l}: "{p}"',
        'Please translate into {l}: "{p}"',
    ]
    fillers = [{"p": p, "l": l} for p in PHRASES for l in LANGUAGES]
    out += pick(r, combos(r, phrase_t, fillers, 2), 260)

    word_t = [
        'What is the {l} word for "{w}"?',
        'How do you say "{w}" in {l}?',
        'Translate the word "{w}" into {l}.',
    ]
    fillers = [{"w": w, "l": l} for w in WORDS for l in LANGUAGES]
    out += pick(r, combos(r, word_t, fillers, 1), 100)

    two_t = ['Translate "{p}" into {a} and {b}.', 'How do you say "{p}" in {a} and in {b}?']
    fillers = []
    for p in r.sample(PHRASES, 30):
        a, b = r.sample(LANGUAGES, 2)
        fillers.append({"p": p, "a": a, "b": b})
    out += pick(r, combos(r, two_t, fillers, 1), 30)
    return out


# --------------------------------------------------------------------------
# known answers & examples
# --------------------------------------------------------------------------


def gen_known_answers() -> tuple[list[dict], dict]:
    r = rng_for("known_answers")
    rows: list[dict] = []
    used: dict = {}

    arith = []
    add_t = ["What is {a} + {b}? Answer with the number only.", "Add {a} and {b}. Reply with just the number."]
    sub_t = ["What is {a} - {b}? Answer with the number only.", "Subtract {b} from {a}. Reply with just the number."]
    mul_t = ["What is {a} × {b}? Answer with the number only.", "Multiply {a} by {b}. Reply with just the number."]

    def add_item(op, a, b, templates):
        key = arith_key(a, op, b)
        ans = {"+": a + b, "-": a - b, "*": a * b}[op]
        # skip repeats, and answers that occur inside the question's own numbers
        if key in used or str(ans) in f"{a} {b}":
            return False
        used[key] = None
        arith.append((r.choice(templates).format(a=a, b=b), str(ans)))
        return True

    n = 0
    while n < 25:
        n += add_item("+", r.randint(10, 89), r.randint(10, 89), add_t)
    n = 0
    while n < 25:
        a = r.randint(30, 99)
        n += add_item("-", a, r.randint(10, a - 5), sub_t)
    n = 0
    while n < 20:
        n += add_item("*", r.randint(2, 9), r.randint(2, 9), mul_t)
    for i, (prompt, ans) in enumerate(arith, 1):
        rows.append({"id": f"arithmetic-{i:03d}", "kind": "arithmetic", "prompt": prompt, "answer": ans})

    cap_one = [
        "What is the capital of {c}? Answer in one word.",
        "Name the capital city of {c}. Answer in one word.",
    ]
    cap_multi = [
        "What is the capital of {c}? Answer with the city name only.",
        "Name the capital city of {c}. Reply with just the city name.",
    ]
    for i, (country, capital, answer) in enumerate(KNOWN_CAPITALS, 1):
        templates = cap_one if " " not in capital else cap_multi
        rows.append({
            "id": f"capital-{i:03d}",
            "kind": "capital",
            "prompt": r.choice(templates).format(c=country),
            "answer": answer,
        })
    return rows, used


EXAMPLES = [
    {"label": "Fact: largest hot desert", "prompt": "What is the largest hot desert in the world?"},
    {"label": "Fact: speed of sound", "prompt": "How fast does sound travel through air?"},
    {"label": "List: rainforest animals", "prompt": "List four animals that live in the rainforest."},
    {"label": "List: famous bridges", "prompt": "Name three famous bridges and the cities they are in."},
    {"label": "Code: isogram check", "prompt": "Write a Python function that checks whether a word is an isogram."},
    {"label": "Code: days between dates", "prompt": "Write a Python function that returns the number of days between two dates."},
    {"label": "Story: fearful dragon", "prompt": "Tell a three-sentence story about a dragon who is afraid of fire."},
    {"label": "Poem: cat and rain", "prompt": "Write a short poem about a cat watching the rain from a window."},
    {"label": "Arithmetic: addition", "prompt": "What is 48 + 37?"},
    {"label": "Arithmetic: word problem", "prompt": "A bakery packs 6 muffins in each box. How many muffins are in 7 boxes?"},
    {"label": "Rewrite: make formal", "prompt": 'Rewrite this more formally: "hey, the meeting got moved to 3, don\'t be late"'},
    {"label": "Rewrite: fix grammar", "prompt": 'Fix the grammar in this sentence: "Me and my friends goes to the beach every summer."'},
]
# Arithmetic in the examples, kept out of the math kind as well.
EXAMPLE_ARITH = [(48, "+", 37)]


# --------------------------------------------------------------------------
# build
# --------------------------------------------------------------------------


def build() -> dict:
    """Return {"train", "heldout", "known_answers", "examples"} (lists of dicts)."""
    known, used_arith = gen_known_answers()
    excluded = dict(used_arith)
    for a, op, b in EXAMPLE_ARITH:
        excluded[arith_key(a, op, b)] = None

    generators = {
        "facts": gen_facts,
        "lists": gen_lists,
        "definitions": gen_definitions,
        "explanations": gen_explanations,
        "howto": gen_howto,
        "creative": gen_creative,
        "math": lambda: gen_math(excluded),
        "code": gen_code,
        "rewrite": gen_rewrite,
        "translate": gen_translate,
    }

    reserved = {norm(row["prompt"]): None for row in known}
    for ex in EXAMPLES:
        reserved[norm(ex["prompt"])] = None

    seen: dict[str, None] = {}
    train: list[dict] = []
    heldout: list[dict] = []
    for kind in KINDS:
        cands = []
        for prompt in generators[kind]():
            prompt = " ".join(prompt.split())
            key = norm(prompt)
            if key in seen or key in reserved:
                continue
            seen[key] = None
            cands.append(prompt)
        r = rng_for(f"select:{kind}")
        if len(cands) < PER_KIND:
            raise AssertionError(f"kind {kind!r} has only {len(cands)} candidates (< {PER_KIND})")
        chosen = r.sample(cands, PER_KIND)
        rows = [{"id": f"{kind}-{i:04d}", "kind": kind, "prompt": p} for i, p in enumerate(chosen)]
        held_idx = sorted(r.sample(range(PER_KIND), HELDOUT_PER_KIND))
        held_set = dict.fromkeys(held_idx)
        for i, row in enumerate(rows):
            (heldout if i in held_set else train).append(row)

    examples = [dict(e) for e in EXAMPLES]
    _check(train, heldout, known, examples)
    return {"train": train, "heldout": heldout, "known_answers": known, "examples": examples}


def _check(train, heldout, known, examples) -> None:
    t = [norm(x["prompt"]) for x in train]
    h = [norm(x["prompt"]) for x in heldout]
    k = [norm(x["prompt"]) for x in known]
    e = [norm(x["prompt"]) for x in examples]
    for name, keys in (("train", t), ("heldout", h), ("known_answers", k), ("examples", e)):
        assert len(keys) == len(set(keys)), f"duplicate prompts inside {name}"
    groups = {"train": set(t), "heldout": set(h), "known_answers": set(k), "examples": set(e)}
    names = list(groups)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            overlap = groups[a] & groups[b]
            assert not overlap, f"{a} and {b} overlap: {sorted(overlap)[:3]}"
    assert len(examples) == 12
    assert len(heldout) == HELDOUT_PER_KIND * len(KINDS)
    assert len(known) >= 120
    for row in known:
        # an echo of the question must not count as a correct answer
        assert row["answer"].lower() not in row["prompt"].lower(), row
    ids = [x["id"] for x in train + heldout + known]
    assert len(ids) == len(set(ids)), "duplicate ids"
    for row in train + heldout + known + examples:
        n_words = len(row["prompt"].split())
        assert n_words <= MAX_WORDS, f"prompt too long ({n_words} words): {row['prompt']}"


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="\n") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def main() -> int:
    data = build()
    _write_jsonl(PROMPTS_DIR / "train.jsonl", data["train"])
    _write_jsonl(PROMPTS_DIR / "heldout.jsonl", data["heldout"])
    _write_jsonl(PROMPTS_DIR / "known_answers.jsonl", data["known_answers"])
    EXAMPLES_PATH.parent.mkdir(parents=True, exist_ok=True)
    with EXAMPLES_PATH.open("w", encoding="utf-8", newline="\n") as f:
        json.dump(data["examples"], f, ensure_ascii=False, indent=2)
        f.write("\n")

    print(f"{'kind':<14}{'train':>7}{'heldout':>9}{'total':>7}")
    for kind in KINDS:
        nt = sum(1 for x in data["train"] if x["kind"] == kind)
        nh = sum(1 for x in data["heldout"] if x["kind"] == kind)
        print(f"{kind:<14}{nt:>7}{nh:>9}{nt + nh:>7}")
    nt, nh = len(data["train"]), len(data["heldout"])
    print(f"{'TOTAL':<14}{nt:>7}{nh:>9}{nt + nh:>7}")
    ka = data["known_answers"]
    print(
        f"known_answers: {len(ka)} "
        f"(arithmetic {sum(1 for x in ka if x['kind'] == 'arithmetic')}, "
        f"capital {sum(1 for x in ka if x['kind'] == 'capital')})"
    )
    print(f"examples: {len(data['examples'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
