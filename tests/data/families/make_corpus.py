"""Writes tests/data/families/corpus.json: one text per class a model is shown (prose in eleven
languages, code, JSON pretty and compact, CSV, logs, YAML, hex, UUIDs, base64, digits, whitespace
runs, emoji, markdown). Deterministic (a fixed seed, no clock): run it again and the file is the same.

    python tests/data/families/make_corpus.py
"""

from __future__ import annotations

import base64
import json
import random
import uuid
from pathlib import Path

HERE = Path(__file__).parent
SAMPLES = HERE.parent / "samples"

PROSE = {
    "prose_english": (SAMPLES / "english.txt").read_text(encoding="utf-8"),
    "prose_chinese": (SAMPLES / "chinese.txt").read_text(encoding="utf-8"),
    "prose_japanese": (SAMPLES / "japanese.txt").read_text(encoding="utf-8"),
    "prose_korean": (SAMPLES / "korean.txt").read_text(encoding="utf-8"),
    "prose_german": (
        "Der Ausschuss traf sich am Dienstag, um die Quartalszahlen zu prüfen. Der Umsatz stieg leicht, "
        "die Betriebskosten jedoch deutlich stärker. Mehrere Mitglieder äußerten Bedenken über das Tempo der "
        "Einstellungen in der Entwicklungsabteilung und schlugen vor, die Budgetplanung für das kommende "
        "Geschäftsjahr gründlich zu überarbeiten, bevor neue Verpflichtungen eingegangen werden. "
    ) * 3,
    "prose_french": (
        "Le comité s'est réuni mardi pour examiner les résultats trimestriels, qui ont montré une légère "
        "hausse du chiffre d'affaires mais une augmentation plus nette des coûts d'exploitation. Plusieurs "
        "membres se sont inquiétés du rythme des embauches et ont proposé de revoir le budget de l'année "
        "prochaine avant de prendre de nouveaux engagements. "
    ) * 3,
    "prose_spanish": (
        "El comité se reunió el martes para revisar los resultados trimestrales, que mostraron un aumento "
        "moderado de los ingresos pero un alza más pronunciada de los costes operativos. Varios miembros "
        "expresaron su preocupación por el ritmo de contratación y propusieron revisar el presupuesto del "
        "próximo año antes de asumir nuevos compromisos. "
    ) * 3,
    "prose_russian": (
        "Комитет собрался во вторник, чтобы рассмотреть квартальные результаты, которые показали умеренный "
        "рост выручки, но более резкое увеличение операционных расходов. Несколько членов комитета выразили "
        "обеспокоенность темпами найма и предложили пересмотреть бюджет на следующий год, прежде чем брать "
        "на себя новые обязательства. "
    ) * 3,
    "prose_arabic": (
        "اجتمعت اللجنة يوم الثلاثاء لمراجعة النتائج الفصلية التي أظهرت زيادة طفيفة في الإيرادات وارتفاعا "
        "أكبر في تكاليف التشغيل. وأبدى عدد من الأعضاء قلقهم من وتيرة التوظيف في قسم الهندسة، واقترحوا "
        "مراجعة ميزانية العام المقبل قبل الدخول في التزامات جديدة. "
    ) * 3,
    "prose_hindi": (
        "समिति ने मंगलवार को तिमाही परिणामों की समीक्षा के लिए बैठक की, जिनमें राजस्व में मामूली वृद्धि "
        "लेकिन परिचालन लागत में तेज़ बढ़ोतरी दिखाई दी। कई सदस्यों ने इंजीनियरिंग विभाग में भर्ती की गति पर "
        "चिंता जताई और नई प्रतिबद्धताओं से पहले अगले वर्ष के बजट की समीक्षा का सुझाव दिया। "
    ) * 3,
    "prose_thai": (
        "คณะกรรมการประชุมกันเมื่อวันอังคารเพื่อทบทวนผลประกอบการรายไตรมาส ซึ่งแสดงให้เห็นว่ารายได้เพิ่มขึ้นเล็กน้อย "
        "แต่ต้นทุนการดำเนินงานเพิ่มขึ้นมากกว่า สมาชิกหลายคนแสดงความกังวลเกี่ยวกับอัตราการจ้างงานในฝ่ายวิศวกรรม "
        "และเสนอให้ทบทวนงบประมาณของปีหน้าก่อนที่จะรับภาระผูกพันใหม่ "
    ) * 3,
}


def corpus() -> dict[str, str]:
    rng = random.Random(25)
    texts = dict(PROSE)
    texts["code_python"] = (SAMPLES / "code.py.txt").read_text(encoding="utf-8")
    records = [
        {
            "id": f"ord_{rng.getrandbits(24):06x}",
            "status": rng.choice(["shipped", "pending", "cancelled"]),
            "qty": rng.randint(1, 40),
            "price": round(rng.uniform(1, 500), 2),
            "customer": {"id": rng.randint(10000, 999999), "tier": rng.choice(["gold", "silver"])},
            "tags": rng.sample(["a", "b", "urgent", "gift", "bulk", "retail"], 2),
        }
        for _ in range(40)
    ]
    texts["json_pretty"] = json.dumps({"results": records}, indent=2)
    texts["json_compact"] = json.dumps({"results": records}, separators=(",", ":"))
    rows = ["timestamp,host,latency_ms,bytes,status,ratio"]
    for i in range(120):
        rows.append(
            f"2025-03-{1 + i % 28:02d}T{i % 24:02d}:{(i * 7) % 60:02d}:{(i * 13) % 60:02d}Z,"
            f"web-{rng.randint(1, 64):02d},{rng.randint(1, 99999)},{rng.randint(100, 10**7)},"
            f"{rng.choice([200, 200, 204, 301, 404, 500])},{rng.random():.6f}"
        )
    texts["csv"] = "\n".join(rows)
    lines = []
    for i in range(80):
        lines.append(
            f"2025-03-14 09:{i % 60:02d}:{(i * 17) % 60:02d}.{rng.randint(0, 999):03d} "
            f"{rng.choice(['INFO', 'WARN', 'ERROR', 'DEBUG'])} [worker-{rng.randint(1, 16)}] "
            f"pid={rng.randint(1000, 65535)} req={rng.getrandbits(32):08x} "
            f"{rng.choice(['GET', 'POST'])} /api/v2/items/{rng.randint(1, 10**6)} {rng.randint(1, 3000)}ms"
        )
    texts["logs"] = "\n".join(lines)
    texts["yaml"] = "\n".join(
        f"- name: service-{i}\n  image: registry.example.com/team/svc-{i}:{rng.randint(1, 9)}.{rng.randint(0, 20)}.{rng.randint(0, 99)}\n"
        f"  replicas: {rng.randint(1, 12)}\n  resources:\n    limits: {{cpu: {rng.randint(100, 4000)}m, memory: {rng.randint(64, 8192)}Mi}}"
        for i in range(30)
    )
    texts["hex"] = " ".join(f"{rng.getrandbits(64):016x}" for _ in range(120))
    texts["uuids"] = "\n".join(str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(80))
    texts["base64"] = base64.b64encode(rng.randbytes(2400)).decode()
    texts["digits"] = " ".join(str(rng.randint(0, 10**12)) for _ in range(250))
    texts["digits_run"] = "".join(str(rng.randint(0, 9)) for _ in range(3000))
    texts["decimals"] = ", ".join(f"{rng.uniform(-1000, 1000):.4f}" for _ in range(250))
    texts["whitespace"] = "\n".join(
        " " * rng.randint(0, 40) + rng.choice(["x", "value", "}", "end"]) + "\t" * rng.randint(0, 6) for _ in range(150)
    )
    texts["blank_lines"] = "para\n" + "\n" * 50 + "next\n\n\n\n   \n\t\t\n" * 20
    texts["emoji"] = " ".join(rng.choice("😀🚀🔥✅❌👍🎉🤖📦🧪🇺🇸🇯🇵👨‍👩‍👧‍👦") + rng.choice(["ok", "", "done"]) for _ in range(300))
    texts["markdown"] = "\n".join(
        f"## Section {i}\n\n| key | value |\n|---|---|\n| alpha | {rng.randint(0, 999)} |\n| beta | **{rng.random():.3f}** |\n\n- [ ] item `{i}`\n"
        for i in range(25)
    )
    texts["urls"] = "\n".join(
        f"https://example.com/{rng.choice(['docs', 'api', 'static'])}/{rng.getrandbits(40):x}?q={rng.randint(1, 10**6)}&lang=en#s{i}"
        for i in range(80)
    )
    texts["mixed_code_cjk"] = "def 计算(x):\n    # 返回平方值 ✅\n    return x ** 2  # 사용자 입력\n" * 20
    texts["punctuation"] = "".join(rng.choice("!@#$%^&*()_+-=[]{};':\",./<>?|\\`~") for _ in range(2000))
    return texts


if __name__ == "__main__":
    out = HERE / "corpus.json"
    out.write_text(json.dumps(corpus(), ensure_ascii=False, indent=0, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {out} ({out.stat().st_size} bytes)")
