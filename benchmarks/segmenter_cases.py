"""Hand-made sentence-boundary cases for choosing the document segmenter (issue 42): short
paragraphs in eight languages, each with the sentences a translator would cut it into. Every
case holds something a naive "split after . ! ?" gets wrong: abbreviations (Dr., e.g., z. B.,
p. ex., EE. UU.), decimals and versions, ordinals, quotes after the full stop, ellipses,
URLs, French spacing before ? and !, CJK full stops, and lines wrapped inside a sentence (plain
text and markdown paragraphs are wrapped by hand). Read by benchmarks/bench_segmenters.py."""

from __future__ import annotations

# (language, paragraph, the sentences it holds)
CASES: list[tuple[str, str, list[str]]] = [
    # --- English ---
    ("en", "Dr. Smith arrived at 10 a.m. on Monday. He left at noon.",
     ["Dr. Smith arrived at 10 a.m. on Monday.", "He left at noon."]),
    ("en", "The price rose by 3.5% in Q2. Analysts had expected 2.1%.",
     ["The price rose by 3.5% in Q2.", "Analysts had expected 2.1%."]),
    ("en", "We need fruit, e.g. apples and pears. Bring some tomorrow.",
     ["We need fruit, e.g. apples and pears.", "Bring some tomorrow."]),
    ("en", 'She said, "I\'ll be there at five." Then she hung up.',
     ['She said, "I\'ll be there at five."', "Then she hung up."]),
    ("en", "Wait... what did you say? I couldn't hear you.",
     ["Wait... what did you say?", "I couldn't hear you."]),
    ("en", "The U.S. economy grew faster than expected. Markets rallied.",
     ["The U.S. economy grew faster than expected.", "Markets rallied."]),
    ("en", "Mr. and Mrs. Jones visited St. Louis last week. They loved it.",
     ["Mr. and Mrs. Jones visited St. Louis last week.", "They loved it."]),
    ("en", "See section 4.2 for details. The results are in Fig. 3 and Table 2.",
     ["See section 4.2 for details.", "The results are in Fig. 3 and Table 2."]),
    ("en", "Version 2.0.1 was released yesterday! Did you update? Not yet.",
     ["Version 2.0.1 was released yesterday!", "Did you update?", "Not yet."]),
    ("en", "I paid $12.99 for the book (the hardcover edition). It was worth it.",
     ["I paid $12.99 for the book (the hardcover edition).", "It was worth it."]),
    ("en", "Visit https://example.com/docs/index.html for more. Thanks for reading.",
     ["Visit https://example.com/docs/index.html for more.", "Thanks for reading."]),
    ("en", "The meeting is at 3 p.m. tomorrow. Please be on time.",
     ["The meeting is at 3 p.m. tomorrow.", "Please be on time."]),
    ("en", "\u201cAre you coming?\u201d she asked. \u201cNo,\u201d he said.",
     ["\u201cAre you coming?\u201d she asked.", "\u201cNo,\u201d he said."]),
    ("en", "Prof. Miller et al. published the study in 2019. It was cited widely.",
     ["Prof. Miller et al. published the study in 2019.", "It was cited widely."]),
    ("en", "The server restarts every night,\nwhich clears the cache. Nobody noticed\nuntil "
           "Tuesday.",
     ["The server restarts every night,\nwhich clears the cache.",
      "Nobody noticed\nuntil Tuesday."]),
    ("en", "It costs approx. 40 dollars, i.e. less than last year. We will buy it.",
     ["It costs approx. 40 dollars, i.e. less than last year.", "We will buy it."]),
    ("en", "Call me at 555-1234 ext. 12 tomorrow. I'm free after lunch.",
     ["Call me at 555-1234 ext. 12 tomorrow.", "I'm free after lunch."]),
    ("en", "No. 5 is the best seat in the house. Book it early!",
     ["No. 5 is the best seat in the house.", "Book it early!"]),
    # --- German ---
    ("de", "Dr. M\u00fcller kam um 10 Uhr an. Er ging um 12 Uhr.",
     ["Dr. M\u00fcller kam um 10 Uhr an.", "Er ging um 12 Uhr."]),
    ("de", "Das kostet z. B. 3,50 Euro. Das ist g\u00fcnstig.",
     ["Das kostet z. B. 3,50 Euro.", "Das ist g\u00fcnstig."]),
    ("de", "Am 3. Oktober ist Feiertag. Die Gesch\u00e4fte sind geschlossen.",
     ["Am 3. Oktober ist Feiertag.", "Die Gesch\u00e4fte sind geschlossen."]),
    ("de", "Er sagte: \u201eIch komme morgen.\u201c Dann ging er.",
     ["Er sagte: \u201eIch komme morgen.\u201c", "Dann ging er."]),
    ("de", "Die Firma (gegr. 1998) hat ca. 200 Mitarbeiter. Sie w\u00e4chst schnell.",
     ["Die Firma (gegr. 1998) hat ca. 200 Mitarbeiter.", "Sie w\u00e4chst schnell."]),
    ("de", "\u00c4pfel, Birnen usw. sind Obst. Wir kaufen sie gern.",
     ["\u00c4pfel, Birnen usw. sind Obst.", "Wir kaufen sie gern."]),
    ("de", "Sie wohnt in der Hauptstr. 5 in Berlin. Besuchen Sie sie!",
     ["Sie wohnt in der Hauptstr. 5 in Berlin.", "Besuchen Sie sie!"]),
    ("de", "Im 19. Jahrhundert wuchs die Stadt stark. Heute leben dort 2 Mio. Menschen.",
     ["Im 19. Jahrhundert wuchs die Stadt stark.", "Heute leben dort 2 Mio. Menschen."]),
    ("de", "Was meinst du? Ich wei\u00df es nicht... Vielleicht morgen.",
     ["Was meinst du?", "Ich wei\u00df es nicht...", "Vielleicht morgen."]),
    ("de", "Siehe S. 12 bzw. Abb. 4 f\u00fcr Details. Danke.",
     ["Siehe S. 12 bzw. Abb. 4 f\u00fcr Details.", "Danke."]),
    # --- French ---
    ("fr", "Le prix est de 3,50 \u20ac. C'est raisonnable.",
     ["Le prix est de 3,50 \u20ac.", "C'est raisonnable."]),
    ("fr", "Il a dit\u00a0: \u00ab\u00a0Je viendrai demain.\u00a0\u00bb Puis il est parti.",
     ["Il a dit\u00a0: \u00ab\u00a0Je viendrai demain.\u00a0\u00bb", "Puis il est parti."]),
    ("fr", "Mme Martin habite \u00e0 Paris, p. ex. dans le 5e arrondissement. Elle aime la "
           "ville.",
     ["Mme Martin habite \u00e0 Paris, p. ex. dans le 5e arrondissement.",
      "Elle aime la ville."]),
    ("fr", "Qu'est-ce que tu veux ? Je ne sais pas ! On verra demain.",
     ["Qu'est-ce que tu veux ?", "Je ne sais pas !", "On verra demain."]),
    ("fr", "Voir le chap. 3 pour plus de d\u00e9tails. Merci.",
     ["Voir le chap. 3 pour plus de d\u00e9tails.", "Merci."]),
    ("fr", "M. Dupont travaille \u00e0 l'h\u00f4pital depuis 2001. Il est chirurgien.",
     ["M. Dupont travaille \u00e0 l'h\u00f4pital depuis 2001.", "Il est chirurgien."]),
    ("fr", "La version 1.2 corrige env. 40 bogues. Mettez \u00e0 jour.",
     ["La version 1.2 corrige env. 40 bogues.", "Mettez \u00e0 jour."]),
    # --- Spanish ---
    ("es", "El Sr. Garc\u00eda lleg\u00f3 a las 10. Luego se fue.",
     ["El Sr. Garc\u00eda lleg\u00f3 a las 10.", "Luego se fue."]),
    ("es", "\u00bfD\u00f3nde est\u00e1 la estaci\u00f3n? Est\u00e1 a 2,5 km de aqu\u00ed.",
     ["\u00bfD\u00f3nde est\u00e1 la estaci\u00f3n?", "Est\u00e1 a 2,5 km de aqu\u00ed."]),
    ("es", "\u00a1Qu\u00e9 sorpresa! No lo esperaba.",
     ["\u00a1Qu\u00e9 sorpresa!", "No lo esperaba."]),
    ("es", "La Dra. L\u00f3pez trabaja en Madrid desde 2015. Le gusta mucho.",
     ["La Dra. L\u00f3pez trabaja en Madrid desde 2015.", "Le gusta mucho."]),
    ("es", "Compr\u00e9 frutas, p. ej. manzanas y peras. Estaban frescas.",
     ["Compr\u00e9 frutas, p. ej. manzanas y peras.", "Estaban frescas."]),
    ("es", "Dijo: \u00abVendr\u00e9 ma\u00f1ana.\u00bb Y se fue.",
     ["Dijo: \u00abVendr\u00e9 ma\u00f1ana.\u00bb", "Y se fue."]),
    ("es", "Ud. tiene raz\u00f3n, etc. Hablaremos ma\u00f1ana.",
     ["Ud. tiene raz\u00f3n, etc.", "Hablaremos ma\u00f1ana."]),
    # --- Italian ---
    ("it", "Il dott. Rossi \u00e8 arrivato alle 10. Poi \u00e8 andato via.",
     ["Il dott. Rossi \u00e8 arrivato alle 10.", "Poi \u00e8 andato via."]),
    ("it", "Il prezzo \u00e8 di 3,50 euro. Non \u00e8 caro!",
     ["Il prezzo \u00e8 di 3,50 euro.", "Non \u00e8 caro!"]),
    ("it", "Vedi pag. 7 per i dettagli. Grazie mille.",
     ["Vedi pag. 7 per i dettagli.", "Grazie mille."]),
    # --- Russian ---
    ("ru", "\u0426\u0435\u043d\u0430 \u0432\u044b\u0440\u043e\u0441\u043b\u0430 \u043d\u0430 "
           "3.5%. \u042d\u0442\u043e \u043c\u043d\u043e\u0433\u043e.",
     ["\u0426\u0435\u043d\u0430 \u0432\u044b\u0440\u043e\u0441\u043b\u0430 \u043d\u0430 3.5%.",
      "\u042d\u0442\u043e \u043c\u043d\u043e\u0433\u043e."]),
    ("ru", "\u041e\u043d \u0436\u0438\u0432\u0451\u0442 \u043d\u0430 \u0443\u043b. "
           "\u041b\u0435\u043d\u0438\u043d\u0430. \u042d\u0442\u043e \u0432 "
           "\u0446\u0435\u043d\u0442\u0440\u0435.",
     ["\u041e\u043d \u0436\u0438\u0432\u0451\u0442 \u043d\u0430 \u0443\u043b. "
      "\u041b\u0435\u043d\u0438\u043d\u0430.",
      "\u042d\u0442\u043e \u0432 \u0446\u0435\u043d\u0442\u0440\u0435."]),
    ("ru", "\u0412\u044b \u043f\u0440\u0438\u0434\u0451\u0442\u0435? \u042f "
           "\u043d\u0430\u0434\u0435\u044e\u0441\u044c!",
     ["\u0412\u044b \u043f\u0440\u0438\u0434\u0451\u0442\u0435?",
      "\u042f \u043d\u0430\u0434\u0435\u044e\u0441\u044c!"]),
    # --- Chinese ---
    ("zh", "\u6211\u4eca\u5929\u5f88\u5fd9\u3002\u660e\u5929\u518d\u8bf4\u5427\uff01\u4f60"
           "\u89c9\u5f97\u5462\uff1f",
     ["\u6211\u4eca\u5929\u5f88\u5fd9\u3002", "\u660e\u5929\u518d\u8bf4\u5427\uff01",
      "\u4f60\u89c9\u5f97\u5462\uff1f"]),
    ("zh", "\u4ed6\u8bf4\uff1a\u201c\u6211\u660e\u5929\u6765\u3002\u201d\u7136\u540e\u5c31"
           "\u8d70\u4e86\u3002",
     ["\u4ed6\u8bf4\uff1a\u201c\u6211\u660e\u5929\u6765\u3002\u201d",
      "\u7136\u540e\u5c31\u8d70\u4e86\u3002"]),
    ("zh", "\u4ef7\u683c\u662f3.5\u5143\u3002\u5f88\u4fbf\u5b9c\u3002",
     ["\u4ef7\u683c\u662f3.5\u5143\u3002", "\u5f88\u4fbf\u5b9c\u3002"]),
    ("zh", "\u7248\u672c2.0\u5df2\u53d1\u5e03\uff0c\u8bf7\u66f4\u65b0\u3002\u8c22\u8c22"
           "\uff01",
     ["\u7248\u672c2.0\u5df2\u53d1\u5e03\uff0c\u8bf7\u66f4\u65b0\u3002",
      "\u8c22\u8c22\uff01"]),
    # --- Japanese ---
    ("ja", "\u4eca\u65e5\u306f\u6674\u308c\u3067\u3059\u3002\u660e\u65e5\u306f\u96e8\u304c"
           "\u964d\u308b\u3067\u3057\u3087\u3046\u3002",
     ["\u4eca\u65e5\u306f\u6674\u308c\u3067\u3059\u3002",
      "\u660e\u65e5\u306f\u96e8\u304c\u964d\u308b\u3067\u3057\u3087\u3046\u3002"]),
    ("ja", "\u672c\u5f53\u3067\u3059\u304b\uff1f\u4fe1\u3058\u3089\u308c\u306a\u3044\uff01",
     ["\u672c\u5f53\u3067\u3059\u304b\uff1f", "\u4fe1\u3058\u3089\u308c\u306a\u3044\uff01"]),
    ("ja", "\u5f7c\u306f\u300c\u660e\u65e5\u884c\u304d\u307e\u3059\u3002\u300d\u3068\u8a00"
           "\u3063\u305f\u3002\u305d\u308c\u304b\u3089\u5e30\u3063\u305f\u3002",
     ["\u5f7c\u306f\u300c\u660e\u65e5\u884c\u304d\u307e\u3059\u3002\u300d\u3068\u8a00\u3063"
      "\u305f\u3002", "\u305d\u308c\u304b\u3089\u5e30\u3063\u305f\u3002"]),
    ("ja", "\u4fa1\u683c\u306f3.5\u30c9\u30eb\u3067\u3059\u3002\u5b89\u3044\u3067\u3059"
           "\u306d\u3002",
     ["\u4fa1\u683c\u306f3.5\u30c9\u30eb\u3067\u3059\u3002",
      "\u5b89\u3044\u3067\u3059\u306d\u3002"]),
]
