"""Short paragraphs (1-3 sentences) in 20 languages, written for this project: the test set of
source-language detection (issue 42). Everyday topics, no word lists; the languages include
the pairs a detector confuses (Spanish/Portuguese, Swedish/Danish, Czech/Polish,
Russian/Ukrainian, Chinese/Japanese). Read by tests/test_language_detection.py and
benchmarks/bench_language_id.py; `cases` also cuts them shorter."""

from __future__ import annotations

import re

PARAGRAPHS: dict[str, list[str]] = {
    "en": [
        ("The train was twenty minutes late, so we missed the start of the concert. Luckily the "
         "second half was even better."),
        ("Please remember to water the plants while I am away. The ones on the balcony need water "
         "every evening."),
        ("My grandmother still writes letters by hand. She says an email can never replace the "
         "feeling of opening an envelope."),
        "The new library opens next Monday, with a reading room for children on the ground floor.",
        ("We walked along the river until the sun went down, talking about everything and "
         "nothing. It was the best evening of the summer."),
    ],
    "de": [
        "Morgen früh fahren wir mit dem Zug nach München. Die Fahrt dauert ungefähr vier Stunden.",
        "Kannst du bitte das Fenster schließen? Es ist heute ziemlich kalt geworden.",
        ("Unser Nachbar hat einen kleinen Garten, in dem er Tomaten und Kräuter anbaut. Im Sommer "
         "bringt er uns oft etwas davon vorbei."),
        "Die Sitzung wurde auf Donnerstag verschoben, weil der Projektleiter krank ist.",
        ("Ich habe gestern ein spannendes Buch über die Geschichte der Seefahrt gelesen und "
         "konnte es kaum aus der Hand legen."),
    ],
    "fr": [
        ("Nous avons passé le week-end à la campagne chez mes cousins. Il a plu tout le samedi, "
         "mais le dimanche était magnifique."),
        ("Pourriez-vous m'indiquer le chemin de la gare, s'il vous plaît ? Je crois que je me "
         "suis perdu."),
        ("La boulangerie au coin de la rue vend le meilleur pain du quartier. Il faut arriver "
         "tôt, sinon il n'en reste plus."),
        "Le musée sera fermé pendant deux semaines pour des travaux de rénovation.",
        ("Mon frère apprend à jouer du piano depuis l'automne dernier. Il fait déjà de grands "
         "progrès."),
    ],
    "es": [
        ("Mañana vamos a la playa con unos amigos. Si hace buen tiempo, nos quedaremos hasta la "
         "noche."),
        "El médico me dijo que tengo que descansar y beber mucha agua durante unos días.",
        "¿Sabes a qué hora cierra el supermercado los domingos? Necesito comprar leche y pan.",
        "La película que vimos anoche era demasiado larga, pero la música me encantó.",
        ("Mi hermana vive en un pequeño pueblo de la sierra, donde todos los vecinos se conocen. "
         "En invierno suele nevar bastante."),
    ],
    "it": [
        "Stasera ceniamo da mia zia, che prepara sempre una lasagna buonissima. Porto io il dolce.",
        "Il treno per Firenze è in ritardo di mezz'ora a causa di un guasto sulla linea.",
        ("Abbiamo deciso di ristrutturare la cucina prima dell'estate. I lavori dovrebbero durare "
         "tre settimane."),
        ("Scusi, sa dirmi dove si trova la farmacia più vicina? Ho bisogno di qualcosa per il mal "
         "di testa."),
        ("Da bambino passavo le vacanze dai nonni in campagna, tra galline, biciclette e lunghe "
         "giornate al sole."),
    ],
    "pt": [
        "Ontem fomos ao mercado comprar frutas e legumes para a semana. Estava tudo muito fresco.",
        "Você sabe se a biblioteca abre aos sábados? Preciso devolver dois livros.",
        "O meu avô trabalhou a vida inteira como pescador e ainda acorda antes do nascer do sol.",
        "A reunião foi adiada para a próxima semana, porque metade da equipa está de férias.",
        ("Não consegui dormir bem esta noite por causa do barulho da rua. Vou tentar descansar um "
         "pouco depois do almoço."),
    ],
    "nl": [
        "We fietsen elke ochtend samen naar school, ook als het regent.",
        ("Het restaurant op de hoek is gisteren weer opengegaan na de verbouwing. Het eten is nog "
         "steeds heerlijk."),
        "Kun je morgen de boodschappen doen? Ik moet tot laat werken.",
        "Mijn zus is verhuisd naar een klein dorp aan de kust en heeft nu een hond en twee katten.",
        ("De trein naar Utrecht rijdt vandaag niet vanwege werkzaamheden aan het spoor. Er rijden "
         "wel extra bussen."),
    ],
    "sv": [
        "Vi brukar åka till sommarstugan i juli och bada i sjön varje dag.",
        "Kan du hämta barnen från förskolan i dag? Jag blir sen från jobbet.",
        ("Min mormor bakar de godaste kanelbullarna, och hela huset doftar av kardemumma när hon "
         "håller på."),
        "Mötet flyttades till nästa vecka eftersom flera av kollegorna är sjuka.",
        "Det har snöat hela natten och vägarna är hala. Kör försiktigt om du måste ut.",
    ],
    "da": [
        ("Vi cykler altid på arbejde, også når det blæser meget. Det er den hurtigste måde at "
         "komme rundt i byen på."),
        "Kan du købe mælk og rugbrød på vej hjem? Køleskabet er næsten tomt.",
        "Min bror er lige flyttet til Aarhus, hvor han har fået nyt arbejde på et hospital.",
        "Det regnede hele weekenden, så vi blev inde og spillede brætspil med børnene.",
        ("Biblioteket holder lukket mandag på grund af en personaledag. Du kan aflevere bøgerne i "
         "postkassen ved døren."),
    ],
    "pl": [
        "W sobotę jedziemy z rodzicami nad morze. Mam nadzieję, że pogoda dopisze.",
        "Czy możesz mi pomóc przenieść tę szafę do drugiego pokoju? Sam nie dam rady.",
        "Moja babcia co niedzielę piecze szarlotkę, a cały dom pachnie wtedy cynamonem.",
        "Pociąg do Krakowa był opóźniony o godzinę z powodu awarii sygnalizacji.",
        "Wczoraj wieczorem obejrzeliśmy bardzo ciekawy film dokumentalny o życiu pszczół.",
    ],
    "cs": [
        "O víkendu jsme byli na chalupě a celou sobotu jsme sbírali houby v lese.",
        "Můžeš mi prosím zavolat, až dorazíš domů? Budu se o tebe bát.",
        "Náš soused opravuje staré motorky a v garáži jich má už sedm.",
        "Zítra nepojedu autobusem, protože řidiči stávkují. Půjdu do práce pěšky.",
        "Moje sestra se učí japonsky a v létě chce odjet na měsíc do Tokia.",
    ],
    "ru": [
        "Вчера мы весь вечер гуляли по парку и кормили уток у пруда.",
        "Не забудь взять зонтик, по радио обещали дождь после обеда.",
        ("Моя бабушка живёт в деревне и каждое лето варит варенье из малины. Мы всегда привозим "
         "домой несколько банок."),
        "Поезд до Москвы отправляется в восемь утра, поэтому нам придётся встать очень рано.",
        "Он уже третий год изучает немецкий язык и мечтает поступить в университет в Берлине.",
    ],
    "uk": [
        "Учора ми цілий вечір гуляли містом і пили каву в маленькій кав'ярні біля річки.",
        "Не забудь узяти парасольку, бо синоптики обіцяють зливу.",
        "Моя бабуся щоліта варить вишневе варення, і вся хата пахне ягодами.",
        "Потяг до Львова вирушає о сьомій ранку, тому нам доведеться прокинутися дуже рано.",
        "Наш син цього року пішов до першого класу. Він дуже пишається своїм новим рюкзаком.",
    ],
    "tr": [
        "Bu hafta sonu ailemle birlikte köye gideceğiz. Anneannem bizi çok özledi.",
        "Yarın sabah erkenden toplantım var, o yüzden bu akşam erken yatacağım.",
        "Mahalledeki fırın her sabah taze simit çıkarıyor ve önünde hep uzun bir kuyruk oluyor.",
        "Otobüs yine gecikti, işe yarım saat geç kaldım.",
        "Kardeşim üniversitede mimarlık okuyor ve mezun olunca İstanbul'da çalışmak istiyor.",
    ],
    "fi": [
        "Menemme kesällä mökille ja saunomme joka ilta järven rannalla.",
        "Voitko hakea lapset päiväkodista tänään? Minulla on kokous neljään asti.",
        "Isoäitini leipoo joka joulu karjalanpiirakoita koko suvulle.",
        "Juna Tampereelle on myöhässä noin puoli tuntia teknisen vian vuoksi.",
        "Lunta satoi koko yön, joten tiet ovat aamulla liukkaita. Aja varovasti.",
    ],
    "hu": [
        "Hétvégén a Balatonhoz megyünk a barátainkkal, ha jó idő lesz.",
        "Meg tudnád mondani, hol van a legközelebbi posta? Egy csomagot kell feladnom.",
        "A nagymamám minden vasárnap húslevest főz, és az egész család nála ebédel.",
        "A vonat húsz percet késett, ezért lekéstük a csatlakozást Szegedre.",
        "Tegnap este egy nagyon érdekes előadást hallgattunk meg a csillagászatról.",
    ],
    "el": [
        "Το καλοκαίρι πηγαίνουμε πάντα στο νησί της γιαγιάς μου και κολυμπάμε κάθε μέρα.",
        "Μπορείς να αγοράσεις ψωμί και γάλα όταν γυρίζεις σπίτι;",
        "Η συνάντηση μεταφέρθηκε για την επόμενη Τρίτη, γιατί ο διευθυντής είναι άρρωστος.",
        "Χθες το βράδυ είδαμε μια πολύ ωραία ταινία στον θερινό κινηματογράφο της γειτονιάς.",
        "Ο αδερφός μου σπουδάζει ιατρική στη Θεσσαλονίκη. Θέλει να γίνει παιδίατρος.",
    ],
    "ar": [
        "سنذهب غدًا إلى السوق لشراء الخضار والفواكه. هل تريد أن تأتي معنا؟",
        "تأخر القطار نصف ساعة بسبب الأحوال الجوية السيئة.",
        "تعلمت جدتي الطبخ من والدتها، وما زالت تحضّر أطيب الأطباق في العائلة.",
        "أغلقت المكتبة أبوابها هذا الأسبوع للصيانة، وستفتح من جديد يوم الأحد.",
        "يدرس أخي الهندسة في الجامعة ويحلم بأن يبني جسرًا كبيرًا في مدينتنا.",
    ],
    "zh": [
        "明天我们打算去公园野餐，如果不下雨的话。",
        "我妈妈每个周末都会包饺子，全家人一起吃饭，非常热闹。",
        "这家书店开了二十多年，老板认识很多老顾客。",
        "因为路上堵车，我今天上班迟到了半个小时。",
        "我的弟弟正在学习弹钢琴，他每天晚上都要练习一个小时。",
    ],
    "ja": [
        "明日は友達と一緒に山へハイキングに行く予定です。天気が良いといいですね。",
        "駅の近くに新しいパン屋さんができたので、今朝行ってみました。",
        "祖母は毎年夏になると、庭で育てたきゅうりで漬物を作ってくれます。",
        "電車が事故で遅れたため、会議に十五分ほど遅刻してしまいました。",
        "私の妹は大学で英語を勉強していて、来年はイギリスに留学するつもりです。",
    ],
}

LANGUAGES = list(PARAGRAPHS)
assert len(LANGUAGES) == 20 and all(len(p) == 5 for p in PARAGRAPHS.values())

_SENTENCE_END = re.compile(r"(?<=[.!?。？！])\s*")


def first_sentence(paragraph: str) -> str:
    return _SENTENCE_END.split(paragraph, maxsplit=1)[0]


def first_words(paragraph: str, n: int) -> str:
    """The first `n` words (Chinese and Japanese, written without spaces: 2n characters)."""
    if " " not in paragraph:
        return paragraph[:2 * n]
    return " ".join(paragraph.split()[:n])


def cases(kind: str = "paragraph") -> list[tuple[str, str]]:
    """(ISO 639-1 code, text) of every paragraph, or of its first sentence ("sentence"), or
    of its first five words ("words") or three ("3 words")."""
    shorten = {"paragraph": lambda p: p, "sentence": first_sentence,
               "words": lambda p: first_words(p, 5), "3 words": lambda p: first_words(p, 3)}[kind]
    return [(lang, shorten(p)) for lang, ps in PARAGRAPHS.items() for p in ps]
