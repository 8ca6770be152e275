"""Language codes: ISO 639-1 -> (ISO 639-3, English name), for the languages the translation
models serve, and NLLB-200's choice where an ISO 639-1 code names a macrolanguage or has
several scripts. Data, read by frontend/languages.py."""

from __future__ import annotations

_TABLE = """
af afr Afrikaans|am amh Amharic|ar ara Arabic|as asm Assamese|ay aym Aymara|az aze Azerbaijani
ba bak Bashkir|be bel Belarusian|bg bul Bulgarian|bm bam Bambara|bn ben Bengali|bo bod Tibetan
br bre Breton|bs bos Bosnian|ca cat Catalan|cs ces Czech|cy cym Welsh|da dan Danish|de deu German
dz dzo Dzongkha|ee ewe Ewe|el ell Greek|en eng English|eo epo Esperanto|es spa Spanish
et est Estonian|eu eus Basque|fa fas Persian|ff ful Fulah|fi fin Finnish|fj fij Fijian
fo fao Faroese|fr fra French|fy fry Western Frisian|ga gle Irish|gd gla Scottish Gaelic
gl glg Galician|gn grn Guarani|gu guj Gujarati|ha hau Hausa|he heb Hebrew|hi hin Hindi
hr hrv Croatian|ht hat Haitian Creole|hu hun Hungarian|hy hye Armenian|id ind Indonesian
ig ibo Igbo|is isl Icelandic|it ita Italian|ja jpn Japanese|jv jav Javanese|ka kat Georgian
kg kon Kongo|ki kik Kikuyu|kk kaz Kazakh|km khm Khmer|kn kan Kannada|ko kor Korean
kr kau Kanuri|ks kas Kashmiri|ku kur Kurdish|ky kir Kyrgyz|lb ltz Luxembourgish|lg lug Ganda
li lim Limburgish|ln lin Lingala|lo lao Lao|lt lit Lithuanian|lv lav Latvian|mg mlg Malagasy
mi mri Maori|mk mkd Macedonian|ml mal Malayalam|mn mon Mongolian|mr mar Marathi|ms msa Malay
mt mlt Maltese|my mya Burmese|ne nep Nepali|nl nld Dutch|nn nno Norwegian Nynorsk
nb nob Norwegian Bokmal|no nor Norwegian|ny nya Chichewa|oc oci Occitan|om orm Oromo
or ori Odia|pa pan Punjabi|pl pol Polish|ps pus Pashto|pt por Portuguese|qu que Quechua
rn run Rundi|ro ron Romanian|ru rus Russian|rw kin Kinyarwanda|sa san Sanskrit|sc srd Sardinian
sd snd Sindhi|sg sag Sango|si sin Sinhala|sk slk Slovak|sl slv Slovenian|sm smo Samoan
sn sna Shona|so som Somali|sq sqi Albanian|sr srp Serbian|ss ssw Swati|st sot Southern Sotho
su sun Sundanese|sv swe Swedish|sw swa Swahili|ta tam Tamil|te tel Telugu|tg tgk Tajik
th tha Thai|ti tir Tigrinya|tk tuk Turkmen|tl tgl Tagalog|tn tsn Tswana|tr tur Turkish
ts tso Tsonga|tt tat Tatar|tw twi Twi|ug uig Uyghur|uk ukr Ukrainian|ur urd Urdu|uz uzb Uzbek
vi vie Vietnamese|wo wol Wolof|xh xho Xhosa|yi yid Yiddish|yo yor Yoruba|zh zho Chinese
zu zul Zulu
"""

# ISO 639-1 -> (ISO 639-3, English name)
ISO_639_1: dict[str, tuple[str, str]] = {
    fields[0]: (fields[1], " ".join(fields[2:]))
    for entry in _TABLE.replace("\n", "|").split("|") if (fields := entry.split())
}

# English name (lower case) -> ISO 639-1
BY_NAME: dict[str, str] = {name.lower(): code for code, (_, name) in ISO_639_1.items()}

# NLLB-200's code for an ISO 639-1 code whose ISO 639-3 code names a macrolanguage (NLLB
# has an individual language of it) or several scripts
NLLB_PREFERRED: dict[str, str] = {
    "ar": "arb_Arab", "az": "azj_Latn", "et": "est_Latn", "fa": "pes_Arab", "ff": "fuv_Latn",
    "gn": "grn_Latn", "kr": "knc_Latn", "ks": "kas_Arab", "ku": "kmr_Latn", "lv": "lvs_Latn",
    "mg": "plt_Latn", "mn": "khk_Cyrl", "ms": "zsm_Latn", "ne": "npi_Deva", "no": "nob_Latn",
    "om": "gaz_Latn", "or": "ory_Orya", "ps": "pbt_Arab", "qu": "quy_Latn", "sq": "als_Latn",
    "sw": "swh_Latn", "uz": "uzn_Latn", "yi": "ydd_Hebr", "zh": "zho_Hans", "ay": "ayr_Latn",
}
