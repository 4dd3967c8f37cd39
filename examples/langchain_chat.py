"""LangChain's ChatOpenAI through context-guard (pip install langchain-openai)."""

import os

from langchain_openai import ChatOpenAI

llm = ChatOpenAI(model="gpt-4o-mini", base_url=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8080/v1"))
print(llm.invoke("Say hello in three languages.").content)
